package cacher

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// TestInitialized holds a cache's first list and checks that Initialized
// fails, naming the resource, for as long as the list is held, passes
// once the cache has been ready, even pending again (a re-list) before
// Check looked, never waits for a cache that falls back to etcd, and
// forgets a cache stopped before it was ever ready.
func TestInitialized(t *testing.T) {
	initialized := NewInitialized()
	store := &heldList{release: make(chan struct{})}
	c := newTestCacher(t, func(o *setupOptions) {
		o.wrap = func(s storage.Interface) storage.Interface { store.Interface = s; return store }
		o.config = func(cfg *Config) { cfg.Initialized = initialized }
	})
	if err := initialized.Check(); err == nil || !strings.Contains(err.Error(), "pods") {
		t.Fatalf("Check while the first list is held: %v, want an error naming pods", err)
	}
	close(store.release)
	waitReady(t, c.Cacher)
	// Pending again before Check saw it ready: a re-list right after the
	// first list. It has been ready once, which is what Check waits for.
	c.ready.Set(source.Pending)
	if err := initialized.Check(); err != nil {
		t.Errorf("Check while a cache that was ready re-lists: %v, want nil: its clients keep their state", err)
	}
	c.ready.Set(source.Ready)
	if err := initialized.Check(); err != nil {
		t.Fatalf("Check once ready: %v", err)
	}

	// A cache that falls back to etcd is not waited for.
	fallback := &heldList{release: make(chan struct{})}
	defer close(fallback.release)
	newTestCacher(t, func(o *setupOptions) {
		o.wrap = func(s storage.Interface) storage.Interface { fallback.Interface = s; return fallback }
		o.config = func(cfg *Config) { cfg.Initialized, cfg.ConsistentReadFallback = initialized, true }
	})
	if err := initialized.Check(); err != nil {
		t.Errorf("Check while a cache with ConsistentReadFallback lists: %v, want nil: it reads from etcd meanwhile", err)
	}

	// A second cache that never lists holds Check until it stops.
	held := &heldList{release: make(chan struct{})}
	other := newTestCacher(t, func(o *setupOptions) {
		o.wrap = func(s storage.Interface) storage.Interface { held.Interface = s; return held }
		o.config = func(cfg *Config) { cfg.Initialized = initialized }
	})
	if err := initialized.Check(); err == nil {
		t.Fatal("Check passes while a second cache has not listed")
	}
	stopped := make(chan struct{})
	go func() { other.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("a cache whose first list is held did not stop")
	}
	if err := initialized.Check(); err != nil {
		t.Errorf("Check after the unready cache stopped: %v, want nil", err)
	}
}
