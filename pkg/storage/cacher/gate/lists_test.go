package gate

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	compbasemetrics "k8s.io/component-base/metrics"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// newWaitingGauge is a registered gauge, which waitGauge can read.
func newWaitingGauge() *compbasemetrics.Gauge {
	g := compbasemetrics.NewGauge(&compbasemetrics.GaugeOpts{Name: "lists_waiting_test"})
	compbasemetrics.NewKubeRegistry().MustRegister(g)
	return g
}

// listEntry is one list's passage through a gate, entered in the background.
type listEntry struct {
	cancel context.CancelFunc
	done   chan error
}

func enterList(g *Lists, items int, waiting *compbasemetrics.Gauge) *listEntry {
	ctx, cancel := context.WithCancel(context.Background())
	e := &listEntry{cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- g.Enter(ctx, items, waiting) }()
	return e
}

func (e *listEntry) in(t *testing.T) bool {
	t.Helper()
	select {
	case err := <-e.done:
		if err != nil {
			t.Fatalf("enter: %v", err)
		}
		return true
	default:
		return false
	}
}

func (e *listEntry) waitIn(t *testing.T, what string) {
	t.Helper()
	if err, _ := testkit.Recv(t, e.done, what+" never got in"); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestListGate checks the bound, first come first served, that small lists
// pass a full gate, that a list keeps its place until its request ends or
// for the hold, and that a list whose request ends while it waits leaves
// the queue without a place.
func TestLists(t *testing.T) {
	const hold = 10 * time.Second
	newGate := func(concurrency int) (*Lists, *testingclock.FakeClock, *compbasemetrics.Gauge) {
		clk := testingclock.NewFakeClock(time.Unix(1000, 0))
		return NewLists(ListsConfig{Concurrency: concurrency, MinItems: 10, Hold: hold, Clock: clk}), clk, newWaitingGauge()
	}

	t.Run("bound, in order", func(t *testing.T) {
		g, _, waiting := newGate(2)
		a, b := enterList(g, 10, waiting), enterList(g, 100, waiting)
		a.waitIn(t, "the first list")
		b.waitIn(t, "the second list")
		c := enterList(g, 10, waiting)
		testkit.WaitGauge(t, waiting, 1, "lists waiting")
		d := enterList(g, 10, waiting)
		testkit.WaitGauge(t, waiting, 2, "lists waiting")
		if c.in(t) || d.in(t) {
			t.Fatal("a third list got in with two places")
		}
		small := enterList(g, 9, waiting)
		small.waitIn(t, "a small list, the gate full")
		b.cancel()
		c.waitIn(t, "the first list waiting, once a place was free")
		testkit.WaitGauge(t, waiting, 1, "lists waiting")
		if d.in(t) {
			t.Fatal("the second list waiting got in before the first")
		}
		a.cancel()
		d.waitIn(t, "the second list waiting")
		testkit.WaitGauge(t, waiting, 0, "lists waiting")
	})

	t.Run("hold", func(t *testing.T) {
		g, clk, waiting := newGate(1)
		// A caller whose context never ends.
		if err := g.Enter(context.Background(), 10, waiting); err != nil {
			t.Fatal(err)
		}
		next := enterList(g, 10, waiting)
		testkit.WaitGauge(t, waiting, 1, "lists waiting")
		clk.Step(hold - time.Millisecond)
		if next.in(t) {
			t.Fatal("a list got in before the one ahead ended or held its place for the hold")
		}
		clk.Step(time.Millisecond)
		next.waitIn(t, "the list after a hold")
	})

	t.Run("a waiting list whose request ends", func(t *testing.T) {
		g, _, waiting := newGate(1)
		a := enterList(g, 10, waiting)
		a.waitIn(t, "the first list")
		b := enterList(g, 10, waiting)
		testkit.WaitGauge(t, waiting, 1, "lists waiting")
		b.cancel()
		select {
		case err := <-b.done:
			if err == nil {
				t.Fatal("a list whose request ended while waiting got in")
			}
		case <-time.After(wait.ForeverTestTimeout):
			t.Fatal("a list whose request ended kept waiting")
		}
		testkit.WaitGauge(t, waiting, 0, "lists waiting")
		a.cancel()
		enterList(g, 10, waiting).waitIn(t, "the list after, the place taken by nobody")
	})

	t.Run("no gate", func(t *testing.T) {
		g := NewLists(ListsConfig{})
		if g != nil {
			t.Fatal("a concurrency of 0 made a gate")
		}
		for range 3 {
			if err := g.Enter(context.Background(), 1_000_000, newWaitingGauge()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
