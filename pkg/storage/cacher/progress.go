package cacher

import (
	"context"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
)

// tick sends bookmarks every second. The etcd watch asks for progress
// itself when it hears nothing (internal/source/silence.go).
func (c *Cacher) tick(ctx context.Context) {
	bookmarks := c.cfg.Clock.NewTicker(fanout.BookmarkTick)
	defer bookmarks.Stop()
	defer c.metrics.releaseGauges()
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
		}
	}
}

// requestProgress has the cache's etcd watch ask for a progress
// notification, without waiting.
func (c *Cacher) requestProgress() { c.src.RequestProgress() }
