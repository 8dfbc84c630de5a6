package cacher

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
)

// TestShutdownWaitsForBookmarks checks that Begin returns only once each
// bookmarked watcher has taken its bookmark, since the generic server ends
// every watch as soon as its pre-shutdown hooks return, and that a cache
// registered after Begin bookmarks its watchers too.
func TestShutdownWaitsForBookmarks(t *testing.T) {
	d := newTestDispatcher(64)
	d.put("a", nil, "n1")
	s := NewShutdown()
	s.register(d.dispatcher)
	withBookmarks := storage.Everything
	withBookmarks.AllowWatchBookmarks = true
	w := d.watch(t, withBookmarks, 10, "")

	begun := make(chan struct{})
	go func() {
		s.Begin(context.Background())
		close(begun)
	}()
	// Nothing to wait on for "has not returned": a bounded look.
	select {
	case <-begun:
		t.Fatal("Begin returned before the watcher took its bookmark")
	case <-time.After(100 * time.Millisecond):
	}
	if got := receive(t, w, 1); got[0].typ != watch.Bookmark {
		t.Fatalf("got %v, want a bookmark", got)
	}
	select {
	case <-begun:
	case <-time.After(10 * time.Second):
		t.Fatal("Begin did not return once the bookmark was taken")
	}

	later := newTestDispatcher(64)
	later.put("b", nil, "n1")
	lw := later.watch(t, withBookmarks, 10, "")
	s.register(later.dispatcher)
	if got := receive(t, lw, 1); got[0].typ != watch.Bookmark {
		t.Fatalf("a cache registered after Begin: got %v, want a bookmark", got)
	}
}

// TestShutdownGivesUp checks that Begin returns when its context ends,
// even if a watcher never reads.
func TestShutdownGivesUp(t *testing.T) {
	d := newTestDispatcher(64)
	d.put("a", nil, "n1")
	s := NewShutdown()
	s.register(d.dispatcher)
	withBookmarks := storage.Everything
	withBookmarks.AllowWatchBookmarks = true
	d.watch(t, withBookmarks, 10, "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Begin(ctx) // returns: the test would time out otherwise
}
