package source

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// The consistency check makes upstream's promise (DetectCacheInconsistency:
// the cache holds what etcd holds) for less. Upstream lists the cache and
// etcd, with values, at one revision and compares digests of (namespace,
// name, resourceVersion), then stops serving snapshots on a mismatch. Ours
// compares the cache's keys and resourceVersions with etcd's keys and
// modification revisions at the cache's revision, read keys-only through a
// Keys, so etcd sends a fraction of a list; and on a mismatch it logs
// the first differing key and re-lists, so that the cache is right again.
// Watchers then end with 410, as after any re-list: what they were sent may
// have been wrong.

// Results of a check: the status label of upstream's
// apiserver_storage_consistency_checks_total.
const (
	CheckSuccess = "success"
	CheckFailure = "failure"
	CheckError   = "error"
)

// checkJitter spreads checks over [interval, 1.5×interval], as upstream.
const checkJitter = 0.5

// checkLoop runs a check every ConsistencyCheckInterval until ctx ends.
func (s *Source) checkLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.cfg.Clock.After(wait.Jitter(s.cfg.ConsistencyCheckInterval, checkJitter)):
		}
		s.Check(ctx)
	}
}

// CheckResult is one check's outcome.
type CheckResult struct {
	// Status is one of the Check* results.
	Status string
	// RV is the revision compared at.
	RV uint64
	// Diff describes the first differing key, on failure.
	Diff string
	// Bytes is what etcd sent.
	Bytes int64
	Err   error
}

// Check compares the cache with etcd once, records the result, and asks
// for a re-list on a mismatch.
func (s *Source) Check(ctx context.Context) CheckResult {
	r := s.compareWithEtcd(ctx)
	s.cfg.Metrics.Checked(r.Status)
	gr := s.cfg.GroupResource
	switch r.Status {
	case CheckSuccess:
		klog.V(3).InfoS("Cache consistency check passed", "group", gr.Group, "resource", gr.Resource,
			"resourceVersion", r.RV, "etcdBytes", r.Bytes)
	case CheckError:
		klog.ErrorS(r.Err, "Cache consistency check could not run", "group", gr.Group, "resource", gr.Resource)
	case CheckFailure:
		klog.ErrorS(nil, "Cache consistency check failed; re-listing", "group", gr.Group, "resource", gr.Resource,
			"resourceVersion", r.RV, "firstDifference", r.Diff)
		s.requestRelist(EndInconsistent)
	}
	return r
}

// keyRV is one key and the revision it was last modified at.
type keyRV struct {
	key string
	rv  uint64
}

func (s *Source) compareWithEtcd(ctx context.Context) CheckResult {
	if state, _ := s.cfg.Ready.Get(); state != Ready {
		return CheckResult{Status: CheckError, Err: fmt.Errorf("the cache is not ready")}
	}
	if err := inject.Hit(ctx, inject.ConsistencyCheck); err != nil {
		if inject.Enabled && errors.Is(err, inject.ErrMismatch) {
			return CheckResult{Status: CheckFailure, RV: s.cfg.Objects.Latest().RV, Diff: err.Error()}
		}
		return CheckResult{Status: CheckError, Err: err}
	}
	snap := s.cfg.Objects.Latest()
	cached := make([]keyRV, 0, snap.Len())
	snap.Scan("", true, "", func(o *object.Object) bool {
		cached = append(cached, keyRV{o.Key, o.RV})
		return true
	})
	r := CheckResult{RV: snap.RV}
	i := 0
	var err error
	r.Bytes, err = s.readKeys(ctx, int64(snap.RV), func(key string, modRev int64) {
		if r.Diff != "" {
			return
		}
		etcd := keyRV{key, uint64(modRev)}
		switch {
		case i == len(cached) || etcd.key < cached[i].key:
			r.Diff = fmt.Sprintf("etcd holds %s at resourceVersion %d; the cache does not hold it", etcd.key, etcd.rv)
		case cached[i].key < etcd.key:
			r.Diff = fmt.Sprintf("the cache holds %s at resourceVersion %d; etcd does not hold it", cached[i].key, cached[i].rv)
		case cached[i].rv != etcd.rv:
			r.Diff = fmt.Sprintf("the cache holds %s at resourceVersion %d; etcd at %d", etcd.key, cached[i].rv, etcd.rv)
		}
		i++
	})
	switch {
	case err != nil:
		r.Status, r.Err = CheckError, fmt.Errorf("reading keys at revision %d from etcd: %w", snap.RV, err)
	case r.Diff == "" && i < len(cached):
		r.Status = CheckFailure
		r.Diff = fmt.Sprintf("the cache holds %s at resourceVersion %d; etcd does not hold it", cached[i].key, cached[i].rv)
	case r.Diff != "":
		r.Status = CheckFailure
	default:
		r.Status = CheckSuccess
	}
	return r
}
