package cacher

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/gate"
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
func (h *gateHarness) watchList() *watcher {
	h.t.Helper()
	pred := storage.Everything
	pred.AllowWatchBookmarks = true
	w := mustWatcher(h.t, h.dispatcher, "/pods/", true, pred, 1)
	if _, err := h.register(w, true, true, false, 0); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(w.Stop)
	return w
}

// waiting waits until n watchers wait for a turn, as the gauge says.
func (h *gateHarness) waiting(n int) {
	h.t.Helper()
	testkit.WaitGauge(h.t, h.metrics.initWaiting, float64(n), "watchers waiting for a turn")
}

// initialEvents reads a watch-list's three objects and its bookmark.
func (h *gateHarness) initialEvents(w *watcher) {
	h.t.Helper()
	got := receive(h.t, w, 4)
	if got[0].name != "a" || got[2].name != "c" || got[3].typ != watch.Bookmark {
		h.t.Fatalf("initial events: %v", got)
	}
}

// blocked waits until w's consumer holds one undelivered event: its
// catch-up goroutine is sending the next.
func blocked(t *testing.T, w *watcher) {
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
	if got := receive(t, resumed, 1); got[0].name != "d" {
		t.Fatalf("resumed watch got %v", got)
	}
	h.initialEvents(first)
	h.initialEvents(second)
	h.waiting(0)
}

// TestWatchInitializedAfterInitialEvents checks what priority and fairness
// learns from the cache: a watch-list is executing until its initial
// events are sent, as upstream's cache reports, so that its seats bound
// how many stream at once; a watch with no initial events is initialized
// when it is set up.
func TestWatchInitializedAfterInitialEvents(t *testing.T) {
	c := newTestCacher(t, func(o *setupOptions) { o.config = func(cfg *Config) { cfg.WatcherBuffer = 1 } })
	ctx := context.Background()
	var rv string
	for i := range 3 {
		out := &example.Pod{}
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "ns"}}
		if err := c.Create(ctx, "/pods/ns/"+pod.Name, pod, out, 0); err != nil {
			t.Fatal(err)
		}
		rv = out.ResourceVersion
	}
	signal := newSignal()
	pred := storage.Everything
	pred.AllowWatchBookmarks = true
	w, err := c.Watch(utilflowcontrol.WithInitializationSignal(ctx, signal), "/pods/", storage.ListOptions{
		Recursive: true, Predicate: pred, SendInitialEvents: ptr.To(true)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// The first event fills the buffer: the second is being sent.
	blocked(t, w.(*watcher))
	if signal.signaled() {
		t.Fatal("the watch-list was initialized before its initial events were sent")
	}
	if got := receive(t, w, 4); got[3].typ != watch.Bookmark {
		t.Fatalf("initial events: %v", got)
	}
	testkit.Recv(t, signal.done, "the watch-list never reported its initial events sent")

	signal = newSignal()
	resumed, err := c.Watch(utilflowcontrol.WithInitializationSignal(ctx, signal), "/pods/", storage.ListOptions{
		Recursive: true, Predicate: storage.Everything, ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Stop()
	if !signal.signaled() {
		t.Fatal("a watch from a resourceVersion was not initialized when set up")
	}
}

// signal is an InitializationSignal that can be looked at.
type signal struct {
	once sync.Once
	done chan struct{}
}

func newSignal() *signal { return &signal{done: make(chan struct{})} }

func (s *signal) Signal() { s.once.Do(func() { close(s.done) }) }
func (s *signal) Wait()   { <-s.done }

func (s *signal) signaled() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}
