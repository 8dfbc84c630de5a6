package cacher

import (
	"context"
	"time"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
)

// tick sends bookmarks every second and, if configured, asks etcd for progress.
func (c *Cacher) tick(ctx context.Context) {
	bookmarks := c.cfg.Clock.NewTicker(fanout.BookmarkTick)
	defer bookmarks.Stop()
	defer c.metrics.releaseGauges()
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
			c.d.SendBookmarks(now)
			if c.expiry != nil {
				c.expiry.Expire()
				c.metrics.encoded.Set(float64(c.expiry.Len()))
			}
			c.d.Compacted(c.cfg.Storage.CompactRevision())
			c.d.RecordGauges()
		case <-progress:
			c.requestProgress()
		}
	}
}

// requestProgress has the cache's etcd watch ask for a progress
// notification, without waiting.
func (c *Cacher) requestProgress() { c.src.RequestProgress() }
