package fanout

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/gate"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// gateHarness is a dispatcher with a gate, three objects and watch-lists
// whose consumers the test drives: each watcher's buffer holds one event,
// so a watcher whose consumer does not read blocks in its turn.
type gateHarness struct {
	*testDispatcher
	t *testing.T
}

func newGateHarness(t *testing.T, concurrency int) *gateHarness {
	d := newTestDispatcher(64)
	d.gate = gate.NewInitialEvents(gate.InitialEventsConfig{Concurrency: concurrency, Turn: time.Hour, Stall: time.Hour, Clock: d.clock})
	for _, name := range []string{"a", "b", "c"} {
		d.put(name, nil, "")
	}
	return &gateHarness{testDispatcher: d, t: t}
}

// watchList registers a watch-list with an initial-events-end bookmark.
func (h *gateHarness) watchList() *Watcher {
	h.t.Helper()
	pred := storage.Everything
	pred.AllowWatchBookmarks = true
	w := mustWatcher(h.t, h.Dispatcher, "/pods/", true, pred, 1)
	if _, err := h.Register(w, Start{Initial: true, EndBookmark: true}); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(w.Stop)
	return w
}

// waiting waits until n watchers wait for a turn, as the gauge says.
func (h *gateHarness) waiting(n int) {
	h.t.Helper()
	testkit.WaitGauge(h.t, h.metrics.InitWaiting, float64(n), "watchers waiting for a turn")
}

// initialEvents reads a watch-list's three objects and its bookmark.
func (h *gateHarness) initialEvents(w *Watcher) {
	h.t.Helper()
	got := objecttest.Receive(h.t, w, 4)
	if got[0].Name != "a" || got[2].Name != "c" || got[3].Type != watch.Bookmark {
		h.t.Fatalf("initial events: %v", got)
	}
}

// blocked waits until w's consumer holds one undelivered event: its
// catch-up goroutine is sending the next.
func blocked(t *testing.T, w *Watcher) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return len(w.ch) == cap(w.ch), nil }); err != nil {
		t.Fatal("the watcher never filled its buffer")
	}
}

// TestInitialEventsGateInDispatch checks the gate as the dispatcher uses
// it (gate has the gate's own tests): a watch-list waits while another
// streams its snapshot, and a watch from a resourceVersion, which streams
// no snapshot, does not wait.
func TestInitialEventsGateInDispatch(t *testing.T) {
	h := newGateHarness(t, 1)
	first := h.watchList()
	blocked(t, first)
	second := h.watchList()
	h.waiting(1)
	expectNothing(t, second)
	resumed := h.watch(t, storage.Everything, 10)
	h.put("d", nil, "")
	if got := objecttest.Receive(t, resumed, 1); got[0].Name != "d" {
		t.Fatalf("resumed watch got %v", got)
	}
	h.initialEvents(first)
	h.initialEvents(second)
	h.waiting(0)
}
