package fanout

import (
	"fmt"
	goruntime "runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"

	"k8s.io/component-base/metrics/testutil"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// change is one key's change in a revision: a put with labels, or a
// deletion.
type change struct {
	name   string
	labels map[string]string
	del    bool
}

// revision applies changes as one etcd revision, as a transaction or a
// lease revocation does, and returns the events it made.
func (d *testDispatcher) revision(changes ...change) []*Event {
	d.rv++
	var events []*Event
	for _, c := range changes {
		prev, _ := d.store.Get("/pods/ns/" + c.name)
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: "ns", Labels: c.labels,
			ResourceVersion: strconv.FormatUint(d.rv, 10)}}
		e := &Event{Key: "/pods/ns/" + c.name, Rev: d.rv, Prev: prev, Seen: d.clock.Now().UnixNano()}
		switch {
		case c.del:
			gone := prev.DeepCopyObject().(*example.Pod)
			gone.ResourceVersion = strconv.FormatUint(d.rv, 10)
			e.Type, e.Cur = watch.Deleted, objecttest.PodObject(gone)
		case prev == nil:
			e.Type, e.Cur = watch.Added, objecttest.PodObject(pod)
		default:
			e.Type, e.Cur = watch.Modified, objecttest.PodObject(pod)
		}
		events = append(events, e)
	}
	d.Process(events...)
	return events
}

// seen is what a watcher received: an event, or a bookmark at a
// resourceVersion.
type seen struct {
	typ  watch.EventType
	name string
	rv   uint64
}

// stream is what one test watcher received, read by its own goroutine.
type stream struct {
	// mu guards items.
	mu    sync.Mutex
	items []seen
}

func (s *stream) add(it seen) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.items = append(s.items, it)
}

// has reports whether an event of name arrived.
func (s *stream) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range s.items {
		if it.name == name && it.typ != watch.Bookmark {
			return true
		}
	}
	return false
}

// TestRevisionsDeliveredWhole writes revisions of many events, as lease
// expiries and transactions make, to watchers of every speed and buffer
// size, with selectors and bookmarks: each must receive every event it
// matches, in etcd's order, and never a bookmark ahead of an event it has
// not received. Issue 56: the fan-out parked a watcher at a revision it
// had only part of, and its catch-up resumed after the whole revision;
// not one of 30 watchers got every event of 8 lease expiries.
func TestRevisionsDeliveredWhole(t *testing.T) {
	gold := map[string]string{"tier": "gold"}
	silver := map[string]string{"tier": "silver"}
	tierOf := func(i int) map[string]string {
		if i%3 == 0 {
			return gold
		}
		return silver
	}
	shapes := []struct {
		name string
		// write makes the traffic: revisions of several events.
		write func(d *testDispatcher)
	}{
		{name: "lease expiries", write: func(d *testDispatcher) {
			// 8 leases of 12 objects each, created one by one, then each
			// lease's objects deleted in one revision.
			for lease := range 8 {
				var names []change
				for i := range 12 {
					name := fmt.Sprintf("l%d-%02d", lease, i)
					d.revision(change{name: name, labels: tierOf(i)})
					names = append(names, change{name: name, del: true})
				}
				d.revision(names...)
			}
		}},
		{name: "transactions", write: func(d *testDispatcher) {
			// 20 rounds of 12 creates in one revision, 12 updates that
			// move objects between selectors in another, and the 12
			// deleted in a third.
			for round := range 20 {
				var create, update, del []change
				for i := range 12 {
					name := fmt.Sprintf("t%02d-%02d", round, i)
					create = append(create, change{name: name, labels: tierOf(i)})
					update = append(update, change{name: name, labels: tierOf(i + 1)})
					del = append(del, change{name: name, del: true})
				}
				d.revision(create...)
				d.revision(update...)
				d.revision(del...)
			}
		}},
	}
	type spec struct {
		buffer int
		// yields is how often the consumer yields its CPU per event: the
		// slower, the more often its channel fills inside a revision.
		yields int
		sel    labels.Selector
	}
	var specs []spec
	for _, buffer := range []int{1, 2, 5, 10, 100} {
		for _, yields := range []int{0, 1, 20} {
			for _, sel := range []labels.Selector{labels.Everything(), labels.SelectorFromSet(gold)} {
				specs = append(specs, spec{buffer, yields, sel})
			}
		}
	}
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			// The fake clock moves a minute a bookmark: a window of
			// years keeps every event for the check.
			d := newTestDispatcherWindow(100_000, 1<<62)
			parkedBefore := d.parks(t)
			streams := make([]*stream, len(specs))
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var stopOnce sync.Once
			halt := func() {
				stopOnce.Do(func() { close(stop) })
				wg.Wait()
			}
			t.Cleanup(halt)
			for i, sp := range specs {
				w := d.watch(t, storage.SelectionPredicate{Label: sp.sel, Field: fields.Everything(), AllowWatchBookmarks: true}, sp.buffer)
				streams[i] = &stream{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case e, ok := <-w.ResultChan():
							if !ok {
								return
							}
							m := objecttest.MetaOf(t, e.Object)
							rv, _ := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
							streams[i].add(seen{e.Type, m.GetName(), rv})
							for range sp.yields {
								goruntime.Gosched()
							}
						case <-stop:
							return
						}
					}
				}()
			}
			// Bookmarks go out as the writes go on: each step of the fake
			// clock makes every watcher due one.
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					d.clock.Step(time.Minute)
					d.SendBookmarks(d.clock.Now())
					goruntime.Gosched()
				}
			}()
			shape.write(d)
			// A last object every watcher matches: once it has arrived,
			// everything before it that was sent has.
			d.revision(change{name: "zz-last", labels: gold})
			truth := d.history(t)
			for i := range specs {
				testkit.Eventually(t, fmt.Sprintf("watcher %d's last event", i), func() bool { return streams[i].has("zz-last") })
			}
			halt()
			for i, sp := range specs {
				if err := checkStream(streams[i].items, expectedFor(truth, sp.sel)); err != nil {
					t.Errorf("watcher %d (buffer %d, %d yields, %s): %v", i, sp.buffer, sp.yields, sp.sel, err)
				}
			}
			if d.parks(t) == parkedBefore {
				t.Error("no watcher was parked: the test did not exercise parking inside a revision")
			}
		})
	}
}

// history returns every event in the log, which must hold them all.
func (d *testDispatcher) history(t *testing.T) []*Event {
	t.Helper()
	events, _, ok := d.log.After(history.At(1), 1<<30)
	if !ok {
		t.Fatal("the log dropped events: make it larger")
	}
	return events
}

// parks returns how many times a watcher was parked.
func (d *testDispatcher) parks(t *testing.T) float64 {
	t.Helper()
	n, err := testutil.GetCounterMetricValue(d.metrics.Parked)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// expectedFor returns what a watcher of sel must receive of events.
func expectedFor(events []*Event, sel labels.Selector) []seen {
	var out []seen
	for _, e := range events {
		was := e.Prev != nil && sel.Matches(e.Prev.Labels())
		is := e.Type != watch.Deleted && sel.Matches(e.Cur.Labels())
		name := e.Key[len("/pods/ns/"):]
		switch {
		case was && is:
			out = append(out, seen{watch.Modified, name, e.Rev})
		case is:
			out = append(out, seen{watch.Added, name, e.Rev})
		case was:
			out = append(out, seen{watch.Deleted, name, e.Rev})
		}
	}
	return out
}

// checkStream compares a stream with what it must hold: want's events in
// order, and every bookmark only after every event at or before it.
func checkStream(got, want []seen) error {
	i := 0
	for j, g := range got {
		if g.typ == watch.Bookmark {
			if i < len(want) && want[i].rv <= g.rv {
				return fmt.Errorf("bookmark at %d (item %d) before %v", g.rv, j, want[i])
			}
			continue
		}
		if i >= len(want) {
			return fmt.Errorf("unexpected %v after every event", g)
		}
		if g != want[i] {
			return fmt.Errorf("item %d is %v, want %v (event %d of %d)", j, g, want[i], i, len(want))
		}
		i++
	}
	if i < len(want) {
		return fmt.Errorf("missed %d events from %v", len(want)-i, want[i])
	}
	return nil
}
