package cacher

import (
	"context"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/klog/v2"
)

// A warm start fills the event log from etcd's retained history instead of
// starting it empty. The cache lists the state at an older revision, then
// replays every change since through its normal ingest path, and becomes
// ready once it reaches the revision etcd had when it started. A client
// that comes back to a restarted server with a resourceVersion inside that
// history then gets the events after it, not a 410 and a re-list.
//
// How far back: WarmStartRevisions before etcd's current revision, or etcd's
// compaction if that is later. etcd's compactor keeps five minutes by
// default, so at moderate write rates the revision bound is what applies.

// warmStart returns the revision to list at, or 0 for a cold list, and
// etcd's current revision.
func (c *Cacher) warmStart(ctx context.Context) (from, target uint64, err error) {
	if c.cfg.WarmStartRevisions <= 0 {
		return 0, 0, nil
	}
	target, err = c.cfg.Storage.GetCurrentResourceVersion(ctx)
	if err != nil {
		return 0, 0, err
	}
	lo := max(int64(target)-c.cfg.WarmStartRevisions, c.cfg.Storage.CompactRevision(), 1)
	if uint64(lo) >= target {
		return 0, target, nil
	}
	// etcd may have been compacted past what the store has seen (etcd's
	// own auto-compaction records nothing): find the oldest revision it
	// still serves. Probes are single-item lists, at most log2(bound).
	ok, err := c.readableAt(ctx, uint64(lo))
	if err != nil || ok {
		return uint64(lo), target, err
	}
	hi := int64(target) // readable
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok, err = c.readableAt(ctx, uint64(mid)); err != nil {
			return 0, 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	if uint64(hi) >= target {
		return 0, target, nil
	}
	klog.V(2).InfoS("Warm start bounded by etcd's compaction", "resource", c.cfg.GroupResource, "from", hi)
	return uint64(hi), target, nil
}

// readableAt reports whether etcd still serves the state at rev.
func (c *Cacher) readableAt(ctx context.Context, rev uint64) (bool, error) {
	err := c.cfg.Storage.GetList(ctx, c.cfg.ResourcePrefix, storage.ListOptions{
		ResourceVersion:      strconv.FormatUint(rev, 10),
		ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		Recursive:            true,
		Predicate:            storage.SelectionPredicate{Label: labels.Everything(), Field: fields.Everything(), Limit: 1},
	}, c.cfg.NewListFunc())
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		return false, nil
	default:
		return false, err
	}
}
