package apiserver

import (
	"testing"
	"time"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

// TestCacheConfig checks that what the command line set reaches the
// cache's Config, with the command line's 0 ("off" or "no budget") turned
// into the Config's -1, since the Config's 0 means its default.
func TestCacheConfig(t *testing.T) {
	shutdown := cacher.NewShutdown()
	for _, tc := range []struct {
		name string
		in   WatchCacheOptions
		want cacher.Config
	}{
		{"set", WatchCacheOptions{ConsistencyCheckInterval: 42 * time.Second, WarmStartRevisions: 7, HistoryBudget: 64 << 20,
			ConsistentReadFallback: true, Shutdown: shutdown, InitialEventsConcurrency: 2, Compression: cacher.CompressionS2},
			cacher.Config{ConsistencyCheckInterval: 42 * time.Second, WarmStartRevisions: 7, HistoryBudget: 64 << 20,
				ConsistentReadFallback: true, Shutdown: shutdown, Compression: cacher.CompressionS2}},
		{"off", WatchCacheOptions{},
			cacher.Config{ConsistencyCheckInterval: -1, WarmStartRevisions: -1, HistoryBudget: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := cacheConfig(tc.in)
			if got.ConsistencyCheckInterval != tc.want.ConsistencyCheckInterval || got.WarmStartRevisions != tc.want.WarmStartRevisions ||
				got.HistoryBudget != tc.want.HistoryBudget || got.ConsistentReadFallback != tc.want.ConsistentReadFallback ||
				got.Shutdown != tc.want.Shutdown || got.Compression != tc.want.Compression {
				t.Errorf("check %v, warm start %d, budget %d, fallback %v, shutdown %p, compression %q; want %v, %d, %d, %v, %p, %q",
					got.ConsistencyCheckInterval, got.WarmStartRevisions, got.HistoryBudget, got.ConsistentReadFallback, got.Shutdown, got.Compression,
					tc.want.ConsistencyCheckInterval, tc.want.WarmStartRevisions, tc.want.HistoryBudget, tc.want.ConsistentReadFallback, tc.want.Shutdown,
					tc.want.Compression)
			}
			// A concurrency of 0 is no gate.
			gates := tc.in.InitialEventsConcurrency > 0
			if got.Scheme != Scheme {
				t.Errorf("scheme %p, want the server's, %p", got.Scheme, Scheme)
			}
			if (got.InitialEvents != nil) != gates {
				t.Errorf("initial events gate %v, want %v", got.InitialEvents != nil, gates)
			}
		})
	}
}
