package gate

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	compbasemetrics "k8s.io/component-base/metrics"
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
}

func newHarness(t *testing.T, concurrency int) *harness {
	return newHarnessWith(t, InitialEventsConfig{Concurrency: concurrency, Turn: testTurn, Stall: testStall})
}

func newHarnessWith(t *testing.T, cfg InitialEventsConfig) *harness {
	h := &harness{t: t, clock: testingclock.NewFakeClock(time.Unix(10_000, 0)),
		waiters: compbasemetrics.NewGauge(&compbasemetrics.GaugeOpts{Name: "waiting_test"})}
	compbasemetrics.NewKubeRegistry().MustRegister(h.waiters)
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
		turn, ok := h.g.Enter(Stream{Events: s.ch, Done: s.done}, h.waiters)
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
	if g == nil || cap(g.slots) != 3 || g.turn != DefaultTurn || g.stall != DefaultStall {
		t.Errorf("concurrency 3, the rest defaults: %+v", g)
	}
}
