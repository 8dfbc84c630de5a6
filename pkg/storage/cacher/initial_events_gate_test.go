package cacher

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"
)

// gateHarness is a dispatcher with a gate, three objects and watch-lists
// whose consumers the test drives: each watcher's buffer holds one event,
// so a watcher whose consumer does not read blocks in its turn.
type gateHarness struct {
	*testDispatcher
	t *testing.T
}

// The turn and the stall in these tests, unless a test sets its own.
const (
	testTurn  = 10 * time.Second
	testStall = 100 * time.Millisecond
)

func newGateHarness(t *testing.T, concurrency int) *gateHarness {
	return newGateHarnessWith(t, InitialEventsGateConfig{Concurrency: concurrency, Turn: testTurn, Stall: testStall})
}

func newGateHarnessWith(t *testing.T, cfg InitialEventsGateConfig) *gateHarness {
	d := newTestDispatcher(64)
	if cfg.Concurrency > 0 {
		cfg.Clock = d.clock
		d.gate = NewInitialEventsGate(cfg)
	}
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
	waitGauge(h.t, h.metrics.initWaiting, float64(n), "watchers waiting for a turn")
}

// initialEvents reads a watch-list's three objects and its bookmark.
func (h *gateHarness) initialEvents(w *watcher) {
	h.t.Helper()
	got := receive(h.t, w, 4)
	if got[0].name != "a" || got[2].name != "c" || got[3].typ != watch.Bookmark {
		h.t.Fatalf("initial events: %v", got)
	}
}

// timers waits until n timers wait on the fake clock.
func timers(t *testing.T, h *gateHarness, n int) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return h.clock.Waiters() == n, nil }); err != nil {
		t.Fatalf("%d timers on the clock, want %d", h.clock.Waiters(), n)
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

func TestInitialEventsGate(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{{
		name: "a watch-list waits while another streams, and streams once it is done",
		run: func(t *testing.T) {
			h := newGateHarness(t, 1)
			first := h.watchList()
			blocked(t, first)
			second := h.watchList()
			h.waiting(1)
			expectNothing(t, second)
			h.initialEvents(first)
			h.initialEvents(second)
			h.waiting(0)
		},
	}, {
		name: "first come, first served",
		run: func(t *testing.T) {
			h := newGateHarness(t, 1)
			first := h.watchList()
			blocked(t, first)
			second := h.watchList()
			h.waiting(1)
			third := h.watchList()
			h.waiting(2)
			h.initialEvents(first)
			blocked(t, second)
			h.waiting(1)
			expectNothing(t, third)
			h.initialEvents(second)
			h.initialEvents(third)
		},
	}, {
		name: "a stalled watch-list gives its turn up, and queues again once its client reads",
		run: func(t *testing.T) {
			h := newGateHarness(t, 1)
			stalled := h.watchList()
			blocked(t, stalled)
			timers(t, h, 2) // the turn's and the stall's
			next := h.watchList()
			h.waiting(1)
			h.clock.Step(testStall)
			h.initialEvents(next)
			h.initialEvents(stalled)
		},
	}, {
		name: "a shorter stall keeps the turn",
		run: func(t *testing.T) {
			h := newGateHarness(t, 1)
			stalled := h.watchList()
			blocked(t, stalled)
			timers(t, h, 2)
			next := h.watchList()
			h.waiting(1)
			h.clock.Step(testStall - time.Millisecond)
			expectNothing(t, next)
			h.waiting(1)
			h.initialEvents(stalled)
			h.initialEvents(next)
		},
	}, {
		name: "a stall with nobody waiting keeps the turn, and ends it once somebody waits",
		run: func(t *testing.T) {
			h := newGateHarness(t, 1)
			stalled := h.watchList()
			blocked(t, stalled)
			// The turn's timer and the stall's.
			timers(t, h, 2)
			h.clock.Step(testStall)
			// The stall's timer starts again when it finds nobody waiting.
			timers(t, h, 2)
			next := h.watchList()
			h.waiting(1)
			expectNothing(t, next)
			h.clock.Step(testStall)
			h.initialEvents(next)
			h.initialEvents(stalled)
		},
	}, {
		name: "a turn ends after its length while others wait, stalled or not",
		run: func(t *testing.T) {
			h := newGateHarnessWith(t, InitialEventsGateConfig{Concurrency: 1, Turn: time.Second, Stall: time.Hour})
			slow := h.watchList()
			blocked(t, slow)
			next := h.watchList()
			h.waiting(1)
			h.clock.Step(999 * time.Millisecond)
			expectNothing(t, next)
			h.clock.Step(time.Millisecond)
			h.initialEvents(next)
			h.initialEvents(slow)
		},
	}, {
		name: "a watch-list that ends while waiting leaves the queue",
		run: func(t *testing.T) {
			h := newGateHarness(t, 1)
			first := h.watchList()
			blocked(t, first)
			gone := h.watchList()
			h.waiting(1)
			gone.Stop()
			h.waiting(0)
			if _, open := recvWithin(t, gone.ResultChan(), "the end of the stopped watch"); open {
				t.Fatal("a watcher stopped while waiting delivered an event")
			}
			h.initialEvents(first)
		},
	}, {
		name: "a watch-list that ends in its turn lets the next one in",
		run: func(t *testing.T) {
			h := newGateHarness(t, 1)
			first := h.watchList()
			blocked(t, first)
			next := h.watchList()
			h.waiting(1)
			first.Stop()
			h.initialEvents(next)
		},
	}, {
		name: "two turns at once",
		run: func(t *testing.T) {
			h := newGateHarness(t, 2)
			first, second := h.watchList(), h.watchList()
			blocked(t, first)
			blocked(t, second)
			third := h.watchList()
			h.waiting(1)
			expectNothing(t, third)
			h.initialEvents(second)
			h.initialEvents(third)
			h.initialEvents(first)
		},
	}, {
		name: "no gate: every watch-list streams at once",
		run: func(t *testing.T) {
			h := newGateHarness(t, 0)
			first := h.watchList()
			blocked(t, first)
			second := h.watchList()
			h.initialEvents(second)
			h.initialEvents(first)
		},
	}, {
		name: "a watch from a resourceVersion does not wait",
		run: func(t *testing.T) {
			h := newGateHarness(t, 1)
			first := h.watchList()
			blocked(t, first)
			resumed := h.watch(t, storage.Everything, 10)
			h.put("d", nil, "")
			if got := receive(t, resumed, 1); got[0].name != "d" {
				t.Fatalf("resumed watch got %v", got)
			}
			h.initialEvents(first)
		},
	}} {
		t.Run(tc.name, tc.run)
	}
}

func TestNewInitialEventsGate(t *testing.T) {
	for _, n := range []int{0, -1} {
		if g := NewInitialEventsGate(InitialEventsGateConfig{Concurrency: n}); g != nil {
			t.Errorf("concurrency %d: a gate, want none (no bound)", n)
		}
	}
	if g := NewInitialEventsGate(InitialEventsGateConfig{Concurrency: 3}); g == nil || cap(g.slots) != 3 {
		t.Errorf("concurrency 3: %v", g)
	}
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
	recvWithin(t, signal.done, "the watch-list never reported its initial events sent")

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

// fakeForeground is busy or not, and tells each time it is asked; a
// request is in flight while inFlight is set and open, and flightAsked,
// if set, tells when that is asked.
type fakeForeground struct {
	busy                  bool
	asked                 chan struct{}
	inFlight, flightAsked chan struct{}
}

func (f *fakeForeground) Busy() bool {
	f.asked <- struct{}{}
	return f.busy
}

// waitAsked waits until the watcher asks the fake foreground what says,
// as asked tells.
func waitAsked(t *testing.T, asked <-chan struct{}, what string) {
	t.Helper()
	recvWithin(t, asked, "the watcher never asked "+what)
}

func (f *fakeForeground) InFlight() <-chan struct{} {
	if f.flightAsked != nil {
		f.flightAsked <- struct{}{}
	}
	if f.inFlight == nil {
		return nil
	}
	return f.inFlight
}

// TestInitialEventsYield checks that a watch-list yields to a request in
// flight, once it has streamed for minRun, until the request ends or the
// credit it earned by streaming is spent.
func TestInitialEventsYield(t *testing.T) {
	const ran = 4 * minRun // streamed before "c"; earns as much credit at share 0.5
	for _, tc := range []struct {
		name string
		ran  time.Duration
		// end ends the request in the yield; otherwise the credit runs out.
		end bool
		// yield is whether "c" waits.
		yield bool
	}{
		{name: "yields until the request ends", ran: ran, end: true, yield: true},
		{name: "yields until the credit is spent", ran: ran, yield: true},
		{name: "streams minRun before it yields", ran: minRun - time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fg := &fakeForeground{busy: true, asked: make(chan struct{}, 1), inFlight: make(chan struct{}),
				flightAsked: make(chan struct{}, 1)}
			h := newGateHarnessWith(t, InitialEventsGateConfig{Concurrency: 1, Turn: testTurn, Stall: testStall,
				Foreground: fg, Share: 0.5, Slice: time.Hour})
			w := h.watchList()
			blocked(t, w) // "a" is in the buffer, "b" waits for room
			h.clock.Step(tc.ran)
			if got := receive(t, w, 1); got[0].name != "a" {
				t.Fatalf("first event %v", got)
			}
			if !tc.yield {
				h.initialEventsAfter(w, "b")
				return
			}
			// "b" went out; before "c" the watcher asks for requests in
			// flight, and yields.
			waitAsked(t, fg.flightAsked, "for requests in flight")
			timers(t, h, 2) // the turn's and the yield's
			if got := receive(t, w, 1); got[0].name != "b" {
				t.Fatalf("second event %v", got)
			}
			expectNothing(t, w)
			if tc.end {
				close(fg.inFlight)
			} else {
				h.clock.Step(tc.ran - time.Microsecond)
				if n := h.clock.Waiters(); n != 2 {
					t.Fatalf("the yield ended before the credit was spent: %d timers, want 2", n)
				}
				expectNothing(t, w)
				h.clock.Step(time.Microsecond)
			}
			h.initialEventsAfter(w, "c")
		})
	}
}

// TestInitialEventsPace checks that a watch-list, while the foreground is
// busy, streams for a slice and then pauses for as long as keeps it to its
// share of the time, and streams without pause otherwise.
func TestInitialEventsPace(t *testing.T) {
	const slice = 2 * time.Millisecond
	for _, tc := range []struct {
		name  string
		busy  bool
		share float64
		// pause is how long the third event waits once two went out in
		// a slice; zero if it does not.
		pause time.Duration
		// stop stops the watcher in its pause.
		stop bool
	}{
		{name: "busy, half the time: a pause as long as the slice", busy: true, share: 0.5, pause: slice},
		{name: "busy, a quarter of the time: a pause three slices long", busy: true, share: 0.25, pause: 3 * slice},
		{name: "idle: no pause", share: 0.5},
		{name: "a share of 1: no pause, and the foreground is not asked", busy: true, share: 1},
		{name: "a watcher stopped in its pause ends", busy: true, share: 0.5, pause: slice, stop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fg := &fakeForeground{busy: tc.busy, asked: make(chan struct{}, 1)}
			h := newGateHarnessWith(t, InitialEventsGateConfig{Concurrency: 1, Turn: testTurn, Stall: testStall,
				Foreground: fg, Share: tc.share, Slice: slice})
			pausedBefore, _ := testutil.GetCounterMetricValue(h.metrics.initPaused)
			w := h.watchList()
			// "a" is in the buffer, "b" waits for room; a slice passes.
			blocked(t, w)
			h.clock.Step(slice)
			if got := receive(t, w, 1); got[0].name != "a" {
				t.Fatalf("first event %v", got)
			}
			if tc.share >= 1 {
				h.initialEventsAfter(w, "b")
				select {
				case <-fg.asked:
					t.Fatal("the foreground was asked with a share of 1")
				default:
				}
				return
			}
			// "b" went out; before "c" the watcher asks the foreground.
			waitAsked(t, fg.asked, "whether the foreground is busy")
			if tc.pause == 0 {
				h.initialEventsAfter(w, "b")
				return
			}
			timers(t, h, 2) // the turn's and the pause's
			if got := receive(t, w, 1); got[0].name != "b" {
				t.Fatalf("second event %v", got)
			}
			if tc.stop {
				w.Stop()
				if _, open := recvWithin(t, w.ResultChan(), "the end of the stopped watch"); open {
					t.Fatal("a watcher stopped in its pause delivered an event")
				}
				return
			}
			h.clock.Step(tc.pause - time.Microsecond)
			// Step fires due timers before it returns.
			if n := h.clock.Waiters(); n != 2 {
				t.Fatalf("the pause ended before its length: %d timers, want the turn's and the pause's", n)
			}
			expectNothing(t, w)
			h.clock.Step(time.Microsecond)
			h.initialEventsAfter(w, "c")
			if paused, _ := testutil.GetCounterMetricValue(h.metrics.initPaused); math.Abs(paused-pausedBefore-tc.pause.Seconds()) > 1e-9 {
				t.Errorf("%vs paused, as the metric says, want %v", paused-pausedBefore, tc.pause.Seconds())
			}
		})
	}
}

// initialEventsAfter reads a watch-list's events from the object named
// first to its bookmark.
func (h *gateHarness) initialEventsAfter(w *watcher, first string) {
	h.t.Helper()
	n := map[string]int{"b": 3, "c": 2}[first]
	got := receive(h.t, w, n)
	if got[0].name != first || got[n-1].typ != watch.Bookmark {
		h.t.Fatalf("events from %s: %v", first, got)
	}
}

// TestInitialEventsPauseKeepsTurn checks that a pause moves the end of the
// watcher's turn: a paused watcher uses no CPU, which turns share out.
func TestInitialEventsPauseKeepsTurn(t *testing.T) {
	const slice = 2 * time.Millisecond
	fg := &fakeForeground{busy: true, asked: make(chan struct{}, 1)}
	h := newGateHarnessWith(t, InitialEventsGateConfig{Concurrency: 1, Turn: 3 * time.Millisecond, Stall: time.Hour,
		Foreground: fg, Share: 0.5, Slice: slice})
	first := h.watchList()
	blocked(t, first) // "a" is in the buffer, "b" waits for room
	next := h.watchList()
	h.waiting(1)
	h.clock.Step(slice)
	if got := receive(t, first, 1); got[0].name != "a" {
		t.Fatalf("first event %v", got)
	}
	// "b" went out; "c" waits for the pause.
	waitAsked(t, fg.asked, "whether the foreground is busy")
	timers(t, h, 2) // the turn's and the pause's
	// The turn's end (3 ms) passes in the pause (2 to 4 ms), which moves
	// it to 5 ms: the watch-list sends the rest in its turn, before the
	// next one streams. Had the turn ended, it would wait for the next
	// one, whose client this test does not read yet, to send its last.
	h.clock.Step(slice)
	h.initialEventsAfter(first, "b")
	h.initialEvents(next)
}
