package fanout

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// everythingWithBookmarks selects everything, with bookmarks.
var everythingWithBookmarks = func() storage.SelectionPredicate {
	p := storage.Everything
	p.AllowWatchBookmarks = true
	return p
}()

// newShutdownTest is a dispatcher holding pods named names, registered
// with a new Shutdown.
func newShutdownTest(names ...string) (*testDispatcher, *Shutdown) {
	d := newTestDispatcher(64)
	for _, name := range names {
		d.put(name, nil, "n1")
	}
	s := NewShutdown()
	s.Register(d.Dispatcher)
	return d, s
}

// TestShutdownWaitsForBookmarks checks that Begin returns only once each
// bookmarked watcher has taken its bookmark, since the generic server ends
// every watch as soon as its pre-shutdown hooks return, and that a cache
// registered after Begin bookmarks its watchers too.
func TestShutdownWaitsForBookmarks(t *testing.T) {
	d, s := newShutdownTest("a")
	w := d.watch(t, everythingWithBookmarks, 10)

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
	if got := objecttest.Receive(t, w, 1); got[0].Type != watch.Bookmark {
		t.Fatalf("got %v, want a bookmark", got)
	}
	select {
	case <-begun:
	case <-time.After(10 * time.Second):
		t.Fatal("Begin did not return once the bookmark was taken")
	}

	later := newTestDispatcher(64)
	later.put("b", nil, "n1")
	lw := later.watch(t, everythingWithBookmarks, 10)
	s.Register(later.Dispatcher)
	if got := objecttest.Receive(t, lw, 1); got[0].Type != watch.Bookmark {
		t.Fatalf("a cache registered after Begin: got %v, want a bookmark", got)
	}
}

// TestShutdownGivesUp checks that Begin returns when its context ends,
// even if a watcher never reads.
func TestShutdownGivesUp(t *testing.T) {
	d, s := newShutdownTest("a")
	d.watch(t, everythingWithBookmarks, 10)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Begin(ctx) // returns: the test would time out otherwise
}

// TestShutdownBookmarksEveryWatcher checks the watchers Begin cannot
// bookmark at once: one that resumed from a resourceVersion ahead of this
// cache (served by another replica before) gets a bookmark at its own
// resourceVersion, never an older one; one still catching up gets its
// bookmark once it reaches the head. Without one, either would end with
// nothing delivered and client-go would re-list.
func TestShutdownBookmarksEveryWatcher(t *testing.T) {
	d, s := newShutdownTest("a", "b", "c")

	ahead := mustWatcher(t, d.Dispatcher, "/pods/", true, everythingWithBookmarks, 10)
	if _, err := d.Register(ahead, Start{From: d.rv + 5}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ahead.Stop)
	// A buffer of one: the catch-up from the first event blocks on it.
	behind := mustWatcher(t, d.Dispatcher, "/pods/", true, everythingWithBookmarks, 1)
	if _, err := d.Register(behind, Start{From: 1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(behind.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go s.Begin(ctx)

	if got := objecttest.Receive(t, ahead, 1); got[0].Type != watch.Bookmark || got[0].RV != fmt.Sprint(d.rv+5) {
		t.Fatalf("a watcher ahead of the cache: got %v, want a bookmark at %d", got, d.rv+5)
	}
	got := objecttest.Receive(t, behind, 4)
	if got[3].Type != watch.Bookmark || got[3].RV != fmt.Sprint(d.rv) {
		t.Fatalf("a watcher catching up: got %v, want its 3 events, then a bookmark at %d", got, d.rv)
	}
}

// TestShutdownBookmarksAFullWatcher checks a synced watcher whose channel is
// full when shutdown begins: its bookmark cannot go out under the
// dispatcher's lock, and must come once the consumer makes room, after the
// event it had not read yet; Begin waits for it. It used to be dropped, and
// the watch ended with no bookmark.
func TestShutdownBookmarksAFullWatcher(t *testing.T) {
	d, s := newShutdownTest("a")
	w := d.watch(t, everythingWithBookmarks, 1)
	d.put("b", nil, "n1") // fills the channel of one

	begun := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		s.Begin(ctx)
		close(begun)
	}()
	// The channel must still be full when shutdown begins.
	if err := wait.PollUntilContextCancel(ctx, time.Millisecond, true, func(context.Context) (bool, error) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.shuttingDown, nil
	}); err != nil {
		t.Fatal("shutdown never began")
	}
	got := objecttest.Receive(t, w, 2)
	if got[0].Name != "b" || got[1].Type != watch.Bookmark || got[1].RV != fmt.Sprint(d.rv) {
		t.Fatalf("a full watcher: got %v, want b, then a bookmark at %d", got, d.rv)
	}
	select {
	case <-begun:
	case <-ctx.Done():
		t.Fatal("Begin did not return once the full watcher took its bookmark")
	}
}
