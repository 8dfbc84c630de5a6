package gate

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// The turn and the stall in these tests, unless a test sets its own.
const (
	testTurn  = 10 * time.Second
	testStall = 100 * time.Millisecond
)

// harness is a gate on a fake clock and watch-lists that stream three
// objects, a, b and c, and a bookmark through it, as the cache streams a
// snapshot. Each watcher's buffer holds one event, so a watcher whose
// consumer the test does not read blocks in its turn.
type harness struct {
	t       *testing.T
	g       *InitialEvents
	clock   *testingclock.FakeClock
	waiters *compbasemetrics.Gauge
	paused  *compbasemetrics.Counter
}

func newHarness(t *testing.T, concurrency int) *harness {
	return newHarnessWith(t, InitialEventsConfig{Concurrency: concurrency, Turn: testTurn, Stall: testStall})
}

func newHarnessWith(t *testing.T, cfg InitialEventsConfig) *harness {
	h := &harness{t: t, clock: testingclock.NewFakeClock(time.Unix(10_000, 0)),
		waiters: compbasemetrics.NewGauge(&compbasemetrics.GaugeOpts{Name: "waiting_test"}),
		paused:  compbasemetrics.NewCounter(&compbasemetrics.CounterOpts{Name: "paused_test"})}
	compbasemetrics.NewKubeRegistry().MustRegister(h.waiters, h.paused)
	cfg.Clock = h.clock
	h.g = NewInitialEvents(cfg)
	return h
}

// stream is a watcher: its buffer, and done, closed when it stops.
type stream struct {
	ch   chan watch.Event
	done chan struct{}
	stop func()
}

// watchList starts a watcher streaming its initial events through the gate.
func (h *harness) watchList() *stream {
	s := &stream{ch: make(chan watch.Event, 1), done: make(chan struct{})}
	s.stop = sync.OnceFunc(func() { close(s.done) })
	go func() {
		defer close(s.ch)
		turn, ok := h.g.Enter(Stream{Events: s.ch, Done: s.done}, h.waiters, h.paused)
		defer turn.Leave()
		for _, name := range []string{"a", "b", "c"} {
			if ok = ok && turn.Send(watch.Event{Type: watch.Added, Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name}}}); !ok {
				return
			}
		}
		turn.Send(watch.Event{Type: watch.Bookmark, Object: &metav1.PartialObjectMetadata{}})
	}()
	h.t.Cleanup(s.stop)
	return s
}

// waiting waits until n watchers wait for a turn, as the gauge says.
func (h *harness) waiting(n int) {
	h.t.Helper()
	testkit.WaitGauge(h.t, h.waiters, float64(n), "watchers waiting for a turn")
}

// receive reads n events from s: an object's name, or "bookmark".
func receive(t *testing.T, s *stream, n int) []string {
	t.Helper()
	var out []string
	for len(out) < n {
		e, ok := testkit.Recv(t, s.ch, "an event")
		if !ok {
			t.Fatalf("the stream ended after %v", out)
		}
		name := e.Object.(*metav1.PartialObjectMetadata).Name
		if e.Type == watch.Bookmark {
			name = "bookmark"
		}
		out = append(out, name)
	}
	return out
}

// initialEvents reads a watch-list's three objects and its bookmark.
func (h *harness) initialEvents(s *stream) {
	h.t.Helper()
	h.initialEventsAfter(s, "a")
}

// initialEventsAfter reads a watch-list's events from the object named
// first to its bookmark.
func (h *harness) initialEventsAfter(s *stream, first string) {
	h.t.Helper()
	want := map[string][]string{"a": {"a", "b", "c", "bookmark"}, "b": {"b", "c", "bookmark"}, "c": {"c", "bookmark"}}[first]
	if got := receive(h.t, s, len(want)); !slices.Equal(got, want) {
		h.t.Fatalf("events from %s: %v, want %v", first, got, want)
	}
}

// timers waits until n timers wait on the fake clock.
func (h *harness) timers(n int) {
	h.t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return h.clock.Waiters() == n, nil }); err != nil {
		h.t.Fatalf("%d timers on the clock, want %d", h.clock.Waiters(), n)
	}
}

// blocked waits until s's consumer holds one undelivered event: the
// watcher has sent one and may not have begun to send the next. A test
// that moves the clock next waits for the stall's timer too: only once
// that is set is the watcher in its send, past the pace it reads the
// clock for; a step before that would move the pause to another event.
func blocked(t *testing.T, s *stream) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return len(s.ch) == cap(s.ch), nil }); err != nil {
		t.Fatal("the watcher never filled its buffer")
	}
}

// expectNothing checks that s holds no event. A watcher that waits for a
// turn sends nothing, so nothing is there to wait for.
func expectNothing(t *testing.T, s *stream) {
	t.Helper()
	select {
	case e := <-s.ch:
		t.Fatalf("unexpected event %v", e)
	default:
	}
}

func TestInitialEvents(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{{
		name: "a watch-list waits while another streams, and streams once it is done",
		run: func(t *testing.T) {
			h := newHarness(t, 1)
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
			h := newHarness(t, 1)
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
			h := newHarness(t, 1)
			stalled := h.watchList()
			blocked(t, stalled)
			h.timers(2) // the turn's and the stall's
			next := h.watchList()
			h.waiting(1)
			h.clock.Step(testStall)
			h.initialEvents(next)
			h.initialEvents(stalled)
		},
	}, {
		name: "a shorter stall keeps the turn",
		run: func(t *testing.T) {
			h := newHarness(t, 1)
			stalled := h.watchList()
			blocked(t, stalled)
			h.timers(2)
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
			h := newHarness(t, 1)
			stalled := h.watchList()
			blocked(t, stalled)
			// The turn's timer and the stall's.
			h.timers(2)
			h.clock.Step(testStall)
			// The stall's timer starts again when it finds nobody waiting.
			h.timers(2)
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
			h := newHarnessWith(t, InitialEventsConfig{Concurrency: 1, Turn: time.Second, Stall: time.Hour})
			slow := h.watchList()
			blocked(t, slow)
			h.timers(2) // the turn's and the stall's: "b" waits for room
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
			h := newHarness(t, 1)
			first := h.watchList()
			blocked(t, first)
			gone := h.watchList()
			h.waiting(1)
			gone.stop()
			h.waiting(0)
			if _, open := testkit.Recv(t, gone.ch, "the end of the stopped watch"); open {
				t.Fatal("a watcher stopped while waiting delivered an event")
			}
			h.initialEvents(first)
		},
	}, {
		name: "a watch-list that ends in its turn lets the next one in",
		run: func(t *testing.T) {
			h := newHarness(t, 1)
			first := h.watchList()
			blocked(t, first)
			next := h.watchList()
			h.waiting(1)
			first.stop()
			h.initialEvents(next)
		},
	}, {
		name: "two turns at once",
		run: func(t *testing.T) {
			h := newHarness(t, 2)
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
			h := newHarness(t, 0)
			first := h.watchList()
			blocked(t, first)
			second := h.watchList()
			h.initialEvents(second)
			h.initialEvents(first)
		},
	}} {
		t.Run(tc.name, tc.run)
	}
}

func TestNewInitialEvents(t *testing.T) {
	for _, n := range []int{0, -1} {
		if g := NewInitialEvents(InitialEventsConfig{Concurrency: n}); g != nil {
			t.Errorf("concurrency %d: a gate, want none (no bound)", n)
		}
	}
	g := NewInitialEvents(InitialEventsConfig{Concurrency: 3})
	if g == nil || cap(g.slots) != 3 || g.turn != DefaultTurn || g.stall != DefaultStall || g.slice != DefaultSlice || g.yield != DefaultYield {
		t.Errorf("concurrency 3, the rest defaults: %+v", g)
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
	testkit.Recv(t, asked, "the watcher never asked "+what)
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
			h := newHarnessWith(t, InitialEventsConfig{Concurrency: 1, Turn: testTurn, Stall: testStall,
				Foreground: fg, Share: 0.5, Slice: time.Hour})
			w := h.watchList()
			blocked(t, w) // "a" is in the buffer, "b" waits for room
			h.timers(2)   // the turn's and the stall's
			h.clock.Step(tc.ran)
			if got := receive(t, w, 1); got[0] != "a" {
				t.Fatalf("first event %v", got)
			}
			if !tc.yield {
				h.initialEventsAfter(w, "b")
				return
			}
			// "b" went out; before "c" the watcher asks for requests in
			// flight, and yields.
			waitAsked(t, fg.flightAsked, "for requests in flight")
			h.timers(2) // the turn's and the yield's
			if got := receive(t, w, 1); got[0] != "b" {
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
			h := newHarnessWith(t, InitialEventsConfig{Concurrency: 1, Turn: testTurn, Stall: testStall,
				Foreground: fg, Share: tc.share, Slice: slice})
			pausedBefore, _ := testutil.GetCounterMetricValue(h.paused)
			w := h.watchList()
			// "a" is in the buffer, "b" waits for room; a slice passes.
			blocked(t, w)
			h.timers(2) // the turn's and the stall's
			h.clock.Step(slice)
			if got := receive(t, w, 1); got[0] != "a" {
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
			h.timers(2) // the turn's and the pause's
			if got := receive(t, w, 1); got[0] != "b" {
				t.Fatalf("second event %v", got)
			}
			if tc.stop {
				w.stop()
				if _, open := testkit.Recv(t, w.ch, "the end of the stopped watch"); open {
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
			if paused, _ := testutil.GetCounterMetricValue(h.paused); math.Abs(paused-pausedBefore-tc.pause.Seconds()) > 1e-9 {
				t.Errorf("%vs paused, as the metric says, want %v", paused-pausedBefore, tc.pause.Seconds())
			}
		})
	}
}

// TestInitialEventsPauseKeepsTurn checks that a pause moves the end of the
// watcher's turn: a paused watcher uses no CPU, which turns share out.
func TestInitialEventsPauseKeepsTurn(t *testing.T) {
	const slice = 2 * time.Millisecond
	fg := &fakeForeground{busy: true, asked: make(chan struct{}, 1)}
	h := newHarnessWith(t, InitialEventsConfig{Concurrency: 1, Turn: 3 * time.Millisecond, Stall: time.Hour,
		Foreground: fg, Share: 0.5, Slice: slice})
	first := h.watchList()
	blocked(t, first) // "a" is in the buffer, "b" waits for room
	h.timers(2)       // the turn's and the stall's
	next := h.watchList()
	h.waiting(1)
	h.clock.Step(slice)
	if got := receive(t, first, 1); got[0] != "a" {
		t.Fatalf("first event %v", got)
	}
	// "b" went out; "c" waits for the pause.
	waitAsked(t, fg.asked, "whether the foreground is busy")
	h.timers(2) // the turn's and the pause's
	// The turn's end (3 ms) passes in the pause (2 to 4 ms), which moves
	// it to 5 ms: the watch-list sends the rest in its turn, before the
	// next one streams. Had the turn ended, it would wait for the next
	// one, whose client this test does not read yet, to send its last.
	h.clock.Step(slice)
	h.initialEventsAfter(first, "b")
	h.initialEvents(next)
}
