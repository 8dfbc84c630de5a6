package cacher

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// tick sends bookmarks every second and, if configured, asks etcd for progress.
func (c *Cacher) tick(ctx context.Context) {
	bookmarks := c.cfg.Clock.NewTicker(bookmarkTick)
	defer bookmarks.Stop()
	defer c.d.metrics.releaseGauges()
	var progress <-chan time.Time
	if c.cfg.PeriodicProgressRequests {
		t := c.cfg.Clock.NewTicker(c.cfg.ProgressRequestInterval)
		defer t.Stop()
		progress = t.C()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-bookmarks.C():
			c.d.sendBookmarks(now)
			if c.pres.expiry != nil {
				c.pres.expiry.Expire()
				c.d.metrics.encoded.Set(float64(c.pres.expiry.Len()))
			}
			c.d.compacted(c.cfg.Storage.CompactRevision())
			c.d.recordGauges()
		case <-progress:
			c.requestProgress()
		}
	}
}

// requestProgress asks etcd for a progress notification on the cache's
// watch, giving up after a progress request interval.
func (c *Cacher) requestProgress() { c.requestProgressWithin(c.cfg.ProgressRequestInterval) }

// requestProgressWithin asks etcd for a progress notification on the
// cache's watch, giving up after timeout: a stalled connection must not
// stall the caller.
func (c *Cacher) requestProgressWithin(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.cfg.Storage.RequestWatchProgress(ctx); err != nil {
		klog.V(4).InfoS("Requesting watch progress failed", "resource", c.cfg.GroupResource, "err", err)
	}
}
