package cacher

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// The consistency check makes upstream's promise (DetectCacheInconsistency:
// the cache holds what etcd holds) for less. Upstream lists the cache and
// etcd, with values, at one revision and compares digests of (namespace,
// name, resourceVersion), then stops serving snapshots on a mismatch. Ours
// compares the cache's keys and resourceVersions with etcd's keys and
// modification revisions at the cache's revision, read keys-only through a
// KeyReader, so etcd sends a fraction of a list; and on a mismatch it logs
// the first differing key and re-lists, so that the cache is right again.
// Watchers then end with 410, as after any re-list: what they were sent may
// have been wrong.

// Results of a check: the status label of upstream's
// apiserver_storage_consistency_checks_total.
const (
	checkSuccess = "success"
	checkFailure = "failure"
	checkError   = "error"
)

// checkJitter spreads checks over [interval, 1.5×interval], as upstream.
const checkJitter = 0.5

// checkLoop runs a check every ConsistencyCheckInterval until ctx ends.
func (c *Cacher) checkLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.cfg.Clock.After(wait.Jitter(c.cfg.ConsistencyCheckInterval, checkJitter)):
		}
		c.checkConsistency(ctx)
	}
}

// checkResult is one check's outcome.
type checkResult struct {
	status string
	// rv is the revision compared at.
	rv uint64
	// diff describes the first differing key, on failure.
	diff string
	// bytes is what etcd sent.
	bytes int64
	err   error
}

// checkConsistency compares the cache with etcd once, records the result,
// and asks for a re-list on a mismatch.
func (c *Cacher) checkConsistency(ctx context.Context) checkResult {
	r := c.compareWithEtcd(ctx)
	c.metrics.consistencyCheck(r.status)
	gr := c.cfg.GroupResource
	switch r.status {
	case checkSuccess:
		klog.V(3).InfoS("Cache consistency check passed", "group", gr.Group, "resource", gr.Resource,
			"resourceVersion", r.rv, "etcdBytes", r.bytes)
	case checkError:
		klog.ErrorS(r.err, "Cache consistency check could not run", "group", gr.Group, "resource", gr.Resource)
	case checkFailure:
		klog.ErrorS(nil, "Cache consistency check failed; re-listing", "group", gr.Group, "resource", gr.Resource,
			"resourceVersion", r.rv, "firstDifference", r.diff)
		c.requestRelist(source.EndInconsistent)
	}
	return r
}

// keyRV is one key and the revision it was last modified at.
type keyRV struct {
	key string
	rv  uint64
}

func (c *Cacher) compareWithEtcd(ctx context.Context) checkResult {
	if state, _ := c.ready.get(); state != ready {
		return checkResult{status: checkError, err: fmt.Errorf("the cache is not ready")}
	}
	snap := c.store.Latest()
	cached := make([]keyRV, 0, snap.Len())
	snap.Scan("", true, "", func(o *object.Object) bool {
		cached = append(cached, keyRV{o.Key, o.RV})
		return true
	})
	r := checkResult{rv: snap.RV}
	i := 0
	var err error
	r.bytes, err = c.cfg.KeyReader.ReadKeys(ctx, int64(snap.RV), func(key string, modRev int64) {
		if r.diff != "" {
			return
		}
		etcd := keyRV{key, uint64(modRev)}
		switch {
		case i == len(cached) || etcd.key < cached[i].key:
			r.diff = fmt.Sprintf("etcd holds %s at resourceVersion %d; the cache does not hold it", etcd.key, etcd.rv)
		case cached[i].key < etcd.key:
			r.diff = fmt.Sprintf("the cache holds %s at resourceVersion %d; etcd does not hold it", cached[i].key, cached[i].rv)
		case cached[i].rv != etcd.rv:
			r.diff = fmt.Sprintf("the cache holds %s at resourceVersion %d; etcd at %d", etcd.key, cached[i].rv, etcd.rv)
		}
		i++
	})
	switch {
	case err != nil:
		r.status, r.err = checkError, fmt.Errorf("reading keys at revision %d from etcd: %w", snap.RV, err)
	case r.diff == "" && i < len(cached):
		r.status = checkFailure
		r.diff = fmt.Sprintf("the cache holds %s at resourceVersion %d; etcd does not hold it", cached[i].key, cached[i].rv)
	case r.diff != "":
		r.status = checkFailure
	default:
		r.status = checkSuccess
	}
	return r
}

// requestRelist makes the cache list again, ending its watchers, as when
// the consistency check finds it wrong. It does not wait.
func (c *Cacher) requestRelist(reason string) {
	select {
	case c.relistRequests <- reason:
	default: // One is already pending.
	}
}
