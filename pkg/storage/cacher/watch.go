package cacher

import (
	"context"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
)

// Watch implements storage.Interface with the semantics of the Kubernetes
// API; see the package documentation.
func (c *Cacher) Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error) {
	rv, err := c.parseRV(opts.ResourceVersion)
	if err != nil {
		return nil, err
	}
	if err := c.ready.Check(c.what()); err != nil {
		if c.cfg.ConsistentReadFallback {
			return c.cfg.Storage.Watch(ctx, key, opts)
		}
		return nil, err
	}
	if key, err = storage.PrepareKey(c.cfg.ResourcePrefix, key, opts.Recursive); err != nil {
		return nil, err
	}
	w, err := fanout.NewWatcher(c.d, key, opts.Recursive, opts.Predicate, c.cfg.WatcherBuffer)
	if err != nil {
		return nil, err
	}
	if w.Sharded() {
		// Upstream's gauge of sharded watches, under its name.
		c.metrics.shardedWatchStarted()
		w.OnEnd = c.metrics.shardedWatchStopped
	}
	if deadline, ok := ctx.Deadline(); ok {
		w.Deadline = deadline.UnixNano()
	}

	start := fanout.Start{From: rv}
	switch initial := opts.SendInitialEvents; {
	case initial != nil && *initial:
		// Watch-list: a state, then the stream.
		start.Initial, start.EndBookmark = true, opts.Predicate.AllowWatchBookmarks
		if opts.ResourceVersion == "" {
			err = c.waitConsistent(ctx)
		} else if rv > 0 {
			err = c.d.WaitFor(ctx, rv, c.cfg.FreshnessTimeout, c.requestProgress)
		}
		if err != nil {
			return nil, err
		}
	case initial == nil && rv == 0:
		// Legacy "0" or unset: the current state as ADDED, then the stream.
		start.Initial = true
	case rv == 0:
		// sendInitialEvents=false with no resourceVersion: from now on.
		start.AtHead = true
	default:
		// Resuming from rv: right after a start, the history before the
		// first list may still be filling in.
		if err := c.src.WaitForBackfill(ctx, rv); err != nil {
			return nil, err
		}
	}
	// Priority and fairness counts a watch as executing until it is set up:
	// with initial events, until they are sent, as upstream's cache tells
	// it; the catch-up goroutine tells it then. Only those watchers carry
	// the context for it.
	if start.Initial {
		w.OnInitialized = func() { utilflowcontrol.WatchInitialized(ctx) }
	}
	wi, err := c.d.Register(w, start)
	if err != nil {
		return nil, err
	}
	if wi == watch.Interface(w) {
		w.StopWith(ctx)
	}
	if !start.Initial {
		utilflowcontrol.WatchInitialized(ctx)
	}
	if testFault != nil {
		wi = testFault(c, wi)
	}
	return wi, nil
}
