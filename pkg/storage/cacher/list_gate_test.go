package cacher

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	compbasemetrics "k8s.io/component-base/metrics"
	testingclock "k8s.io/utils/clock/testing"
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

func enterList(g *ListGate, items int, waiting *compbasemetrics.Gauge) *listEntry {
	ctx, cancel := context.WithCancel(context.Background())
	e := &listEntry{cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- g.enter(ctx, items, waiting) }()
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
	if err, _ := recvWithin(t, e.done, what+" never got in"); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestListGate checks the bound, first come first served, that small lists
// pass a full gate, that a list keeps its place until its request ends or
// for the hold, and that a list whose request ends while it waits leaves
// the queue without a place.
func TestListGate(t *testing.T) {
	const hold = 10 * time.Second
	newGate := func(concurrency int) (*ListGate, *testingclock.FakeClock, *compbasemetrics.Gauge) {
		clk := testingclock.NewFakeClock(time.Unix(1000, 0))
		return NewListGate(ListGateConfig{Concurrency: concurrency, MinItems: 10, Hold: hold, Clock: clk}), clk, newWaitingGauge()
	}

	t.Run("bound, in order", func(t *testing.T) {
		g, _, waiting := newGate(2)
		a, b := enterList(g, 10, waiting), enterList(g, 100, waiting)
		a.waitIn(t, "the first list")
		b.waitIn(t, "the second list")
		c := enterList(g, 10, waiting)
		waitGauge(t, waiting, 1, "lists waiting")
		d := enterList(g, 10, waiting)
		waitGauge(t, waiting, 2, "lists waiting")
		if c.in(t) || d.in(t) {
			t.Fatal("a third list got in with two places")
		}
		small := enterList(g, 9, waiting)
		small.waitIn(t, "a small list, the gate full")
		b.cancel()
		c.waitIn(t, "the first list waiting, once a place was free")
		waitGauge(t, waiting, 1, "lists waiting")
		if d.in(t) {
			t.Fatal("the second list waiting got in before the first")
		}
		a.cancel()
		d.waitIn(t, "the second list waiting")
		waitGauge(t, waiting, 0, "lists waiting")
	})

	t.Run("hold", func(t *testing.T) {
		g, clk, waiting := newGate(1)
		// A caller whose context never ends.
		if err := g.enter(context.Background(), 10, waiting); err != nil {
			t.Fatal(err)
		}
		next := enterList(g, 10, waiting)
		waitGauge(t, waiting, 1, "lists waiting")
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
		waitGauge(t, waiting, 1, "lists waiting")
		b.cancel()
		select {
		case err := <-b.done:
			if err == nil {
				t.Fatal("a list whose request ended while waiting got in")
			}
		case <-time.After(wait.ForeverTestTimeout):
			t.Fatal("a list whose request ended kept waiting")
		}
		waitGauge(t, waiting, 0, "lists waiting")
		a.cancel()
		enterList(g, 10, waiting).waitIn(t, "the list after, the place taken by nobody")
	})

	t.Run("no gate", func(t *testing.T) {
		g := NewListGate(ListGateConfig{})
		if g != nil {
			t.Fatal("a concurrency of 0 made a gate")
		}
		for range 3 {
			if err := g.enter(context.Background(), 1_000_000, newWaitingGauge()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestListGateInGetList checks that a large list from the cache waits for
// the one ahead of it to end before copying its items, that an indexed or
// selective small list does not, and that a list whose deadline passes
// while it waits gets 504 Timeout.
func TestListGateInGetList(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	gate := NewListGate(ListGateConfig{Concurrency: 1, MinItems: 3, Clock: clk})
	c := newTestCacher(t, withNodeNameIndex, func(o *setupOptions) { o.config = func(cfg *Config) { cfg.Lists = gate } })
	ctx := context.Background()
	for i := range 3 {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "ns"},
			Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i)}}
		if err := c.Create(ctx, "/pods/ns/"+pod.Name, pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	list := func(ctx context.Context, pred storage.SelectionPredicate) (*example.PodList, error) {
		out := &example.PodList{}
		err := c.GetList(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: pred}, out)
		return out, err
	}
	first, endFirst := context.WithCancel(ctx)
	if out, err := list(first, storage.Everything); err != nil || len(out.Items) != 3 {
		t.Fatalf("the first list: %d items, %v", len(out.Items), err)
	}

	second := make(chan error, 1)
	go func() {
		out, err := list(ctx, storage.Everything)
		if err == nil && len(out.Items) != 3 {
			err = fmt.Errorf("%d items, want 3", len(out.Items))
		}
		second <- err
	}()
	waitGauge(t, c.metrics.listsWaiting, 1, "large lists waiting")

	pinned := storage.SelectionPredicate{Label: labels.Everything(), Field: fields.OneTermEqualSelector("spec.nodeName", "node-1"),
		GetAttrs: podAttrs, IndexFields: []string{"spec.nodeName"}}
	if out, err := list(ctx, pinned); err != nil || len(out.Items) != 1 {
		t.Fatalf("a list of one object, the gate full: %d items, %v", len(out.Items), err)
	}
	late, endLate := context.WithCancel(ctx)
	lateErr := make(chan error, 1)
	go func() {
		_, err := list(late, storage.Everything)
		lateErr <- err
	}()
	waitGauge(t, c.metrics.listsWaiting, 2, "large lists waiting")
	endLate()
	if err, _ := recvWithin(t, lateErr, "the late list's answer"); !apierrors.IsTimeout(err) {
		t.Fatalf("a large list whose request ended while it waited: %v, want 504 Timeout", err)
	}
	waitGauge(t, c.metrics.listsWaiting, 1, "large lists waiting")

	select {
	case err := <-second:
		t.Fatalf("the second large list ended (%v) before the first", err)
	default:
	}
	endFirst()
	if err, _ := recvWithin(t, second, "the second large list never got in after the first ended"); err != nil {
		t.Fatalf("the second large list: %v", err)
	}
}
