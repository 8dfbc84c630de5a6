package cacher

import (
	"context"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// listPageSize is the page size of the cache's own lists from etcd, as
// upstream's reflector pages its initial list.
const listPageSize = 10000

// firstListPage is the size of the first page of the cache's own lists
// when the rest can be read at once (listSplit): small, so that a list of
// a few thousand objects is decoded on every CPU too.
const firstListPage = 1000

// Retry delays after a failed list.
const (
	minRetryDelay = 100 * time.Millisecond
	maxRetryDelay = 5 * time.Second
)

// run lists, then follows the underlying store until ctx ends. It lists
// again only when following cannot go on without losing events: see
// source.Follower.
// The first list, and a re-list after compaction, start warm: see backfill.go.
func (c *Cacher) run(ctx context.Context) {
	defer close(c.done)
	delay := minRetryDelay
	warm := true
	for ctx.Err() == nil {
		start := c.cfg.Clock.Now()
		rv, err := c.list(ctx)
		var end source.End
		if err != nil {
			c.metrics.initErrors.Inc()
		} else {
			c.metrics.initializations.Inc()
			c.metrics.initDuration.Observe(c.cfg.Clock.Since(start).Seconds())
			delay = minRetryDelay
			listCtx, cancel := context.WithCancel(ctx)
			// The backfill is known before the cache is ready: a watch
			// resuming from before the list as soon as it is ready waits
			// for the history it fills, not a 410.
			if warm {
				c.startBackfill(listCtx, rv)
			}
			c.ready.set(ready)
			end = c.src.Follow(listCtx, rv, c.relistRequests, c.handle)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		c.ready.set(pending)
		if err == nil {
			c.metrics.relist(end.Reason)
			c.d.EndAll(fmt.Sprintf("the watch cache for %s must list again (%v)", c.cfg.GroupResource, end))
			klog.InfoS("Watch cache is re-listing", "resource", c.cfg.GroupResource, "reason", end.Reason, "err", end.Err)
		}
		// After a compaction the history since it is sound; after an
		// unreadable event or a failed check it may hold the cause.
		warm = err == nil && end.Reason == source.EndCompacted
		select {
		case <-ctx.Done():
			return
		case <-c.cfg.Clock.After(delay):
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// list reads every object at the current revision and installs them,
// ending every open watcher: events between its position and the list are
// unknown.
func (c *Cacher) list(ctx context.Context) (uint64, error) {
	// This list answers any re-list the consistency check asked for.
	select {
	case <-c.relistRequests:
	default:
	}
	objs, rv, err := c.listAt(ctx, 0)
	if err != nil {
		return 0, err
	}
	c.d.Reset(objs, rv)
	return rv, nil
}

// listAt reads every object at revision rev, or at the current one for 0.
func (c *Cacher) listAt(ctx context.Context, rev uint64) ([]*object.Object, uint64, error) {
	var objs []*object.Object
	var rv uint64
	opts := storage.ListOptions{
		Recursive: true,
		Predicate: storage.SelectionPredicate{Label: labels.Everything(), Field: fields.Everything(), Limit: c.cfg.listPageSize},
	}
	if c.cfg.KeyReader != nil {
		opts.Predicate.Limit = min(opts.Predicate.Limit, firstListPage)
	}
	if rev > 0 {
		opts.ResourceVersion = strconv.FormatUint(rev, 10)
		opts.ResourceVersionMatch = metav1.ResourceVersionMatchExact
	}
	for {
		page, pageRV, next, err := c.listPage(ctx, opts)
		if err != nil {
			return nil, 0, err
		}
		objs, rv = append(objs, page...), pageRV
		if next == "" {
			return objs, rv, nil
		}
		if c.cfg.KeyReader != nil {
			rest, err := c.listSplit(ctx, opts, rv, objs[len(objs)-1].Key)
			if err != nil {
				return nil, 0, err
			}
			return append(objs, rest...), rv, nil
		}
		// Continue tokens carry their revision.
		opts.Predicate.Continue = next
		opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	}
}

// listPage reads one page of a list from the underlying store, and returns
// its objects, its revision and its continue token.
func (c *Cacher) listPage(ctx context.Context, opts storage.ListOptions) ([]*object.Object, uint64, string, error) {
	list := c.cfg.NewListFunc()
	if err := c.cfg.Storage.GetList(ctx, c.cfg.ResourcePrefix, opts, list); err != nil {
		return nil, 0, "", fmt.Errorf("listing %s: %w", c.cfg.GroupResource, err)
	}
	var objs []*object.Object
	err := meta.EachListItem(list, func(item runtime.Object) error {
		o, err := c.build.Build(item)
		if err == nil {
			objs = append(objs, o)
		}
		return err
	})
	if err != nil {
		return nil, 0, "", err
	}
	object.PackBytes(objs)
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return nil, 0, "", err
	}
	rv, err := c.cfg.Versioner.ParseResourceVersion(lm.GetResourceVersion())
	if err != nil {
		return nil, 0, "", err
	}
	return objs, rv, lm.GetContinue(), nil
}

// replayed reports whether o, from an etcd event, is one the cache already
// applied. etcd sends a watch's events in revision order, but a watch its
// client resumed on another member can start below the revision the cache
// asked for and repeat events (etcd-io/etcd#20221: the client takes its
// resume revision from a progress notification of a member that is
// behind). Applied again, such an event would put an old version back in
// the store, under a newer resourceVersion: the state lists read. An event
// below the head is a repeat; one at the head is if the store holds its
// key at that revision already, as the other keys of a transaction, which
// share its revision, are not.
func (c *Cacher) replayed(o, prev *object.Object) bool {
	_, head := c.log.Bounds()
	return o.RV < head || (o.RV == head && prev != nil && prev.RV == o.RV)
}

// ingest turns one etcd event into a cached event. decoded is when the
// etcd3 store decoded it, if it said.
func (c *Cacher) ingest(ev watch.Event, decoded time.Time) error {
	o, err := c.build.Build(ev.Object)
	if err != nil {
		return err
	}
	c.metrics.eventsReceived.Inc()
	prev, _ := c.store.Get(o.Key)
	if c.replayed(o, prev) {
		c.metrics.replayed.Inc()
		klog.V(2).InfoS("Dropped an event etcd delivered again", "resource", c.cfg.GroupResource, "key", o.Key, "resourceVersion", o.RV)
		return nil
	}
	c.metrics.resourceVersion(o.RV)
	e := &fanout.Event{Key: o.Key, Rev: o.RV, Cur: o, Prev: prev, Seen: c.cfg.Clock.Now()}
	if !decoded.IsZero() {
		// The dispatch latency compares real times, as the decode time is.
		e.Decoded, e.Received = decoded.UnixNano(), time.Now().UnixNano()
	}
	switch {
	case ev.Type == watch.Deleted && prev == nil:
		// Deleting what the cache never held: nothing to tell watchers.
		c.d.Progress(o.RV)
		return nil
	case ev.Type == watch.Deleted:
		e.Type = watch.Deleted
	case prev == nil:
		e.Type = watch.Added
	default:
		e.Type = watch.Modified
	}
	c.d.Process(e)
	return nil
}

// handle applies one event from the etcd watch. stop is true when the
// event ends the watch.
func (c *Cacher) handle(ev watch.Event) (end source.End, stop bool) {
	var decoded time.Time
	ev, decoded = source.UnwrapRecordTime(ev)
	switch ev.Type {
	case watch.Bookmark:
		rv, err := c.cfg.Versioner.ObjectResourceVersion(ev.Object)
		if err != nil {
			return source.End{Reason: source.EndUnreadable, Relist: true, Err: err}, true
		}
		c.d.Progress(rv)
	case watch.Added, watch.Modified, watch.Deleted:
		if err := c.ingest(ev, decoded); err != nil {
			return source.End{Reason: source.EndUnreadable, Relist: true, Err: err}, true
		}
	case watch.Error:
		return source.Classify(apierrors.FromObject(ev.Object)), true
	}
	return source.End{}, false
}
