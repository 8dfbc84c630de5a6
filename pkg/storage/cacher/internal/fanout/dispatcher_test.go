package fanout

import (
	"context"
	"fmt"
	goruntime "runtime"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/component-base/metrics/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// testDispatcher drives a dispatcher without etcd.
type testDispatcher struct {
	*Dispatcher
	clock *testingclock.FakeClock
	rv    uint64
}

func newTestDispatcher(logMax int) *testDispatcher {
	return newTestDispatcherWindow(logMax, time.Minute)
}

// newTestDispatcherWindow is newTestDispatcher with a history window.
func newTestDispatcherWindow(logMax int, window time.Duration) *testDispatcher {
	clk := testingclock.NewFakeClock(time.Unix(10_000, 0))
	s := store.New[*Event](nil)
	l := history.New[*Event](history.Config{Window: window, MinSize: 4, MaxSize: logMax})
	d := NewDispatcher(Config{Store: s, Log: l, Presenter: NewPresenter("spec.nodeName", objecttest.Pods.Codec(), nil),
		Versioner: storage.APIObjectVersioner{}, NewFunc: func() runtime.Object { return &example.Pod{} }, Clock: clk,
		BookmarkFrequency: time.Minute, Metrics: newTestMetrics()})
	d.Reset(nil, 1)
	return &testDispatcher{Dispatcher: d, clock: clk, rv: 1}
}

// put writes a pod with labels and node name, as ingest would.
func (d *testDispatcher) put(name string, lbls map[string]string, node string) {
	d.rv++
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: lbls,
		ResourceVersion: fmt.Sprint(d.rv)}, Spec: example.PodSpec{NodeName: node}}
	o := objecttest.PodObject(pod)
	prev, _ := d.store.Get(o.Key)
	typ := watch.Added
	if prev != nil {
		typ = watch.Modified
	}
	d.Process(&Event{Type: typ, Key: o.Key, Rev: d.rv, Cur: o, Prev: prev, Seen: d.clock.Now().UnixNano()})
}

func (d *testDispatcher) del(name string) {
	d.rv++
	prev, _ := d.store.Get("/pods/ns/" + name)
	gone := prev.DeepCopyObject().(*example.Pod)
	gone.ResourceVersion = fmt.Sprint(d.rv)
	cur := objecttest.PodObject(gone)
	d.Process(&Event{Type: watch.Deleted, Key: prev.Key, Rev: d.rv, Cur: cur, Prev: prev, Seen: d.clock.Now().UnixNano()})
}

func (d *testDispatcher) watch(t *testing.T, pred storage.SelectionPredicate, buffer int) *Watcher {
	t.Helper()
	w := mustWatcher(t, d.Dispatcher, "/pods/", true, pred, buffer)
	if _, err := d.Register(w, Start{From: d.rv}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// mustWatcher builds a watcher, failing the test if the predicate is refused.
func mustWatcher(t testing.TB, d *Dispatcher, key string, recursive bool, pred storage.SelectionPredicate, buffer int) *Watcher {
	t.Helper()
	w, err := NewWatcher(d, key, recursive, pred, buffer)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func expectNothing(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case e := <-w.ch:
		t.Fatalf("unexpected event %s %v", e.Type, e.Object)
	default:
	}
}

func TestSelectorTransitions(t *testing.T) {
	d := newTestDispatcher(100)
	sel := storage.SelectionPredicate{Label: labels.SelectorFromSet(labels.Set{"app": "web"}), Field: fields.Everything()}
	w := d.watch(t, sel, 16)
	web, db := map[string]string{"app": "web"}, map[string]string{"app": "db"}

	d.put("p", db, "")  // 2: never matched: nothing
	d.put("p", web, "") // 3: enters: ADDED
	d.put("p", web, "") // 4: stays: MODIFIED
	d.put("p", db, "")  // 5: leaves: DELETED with the previous state at rv 5
	d.put("p", web, "") // 6: comes back: ADDED
	d.del("p")          // 7: deleted while matching: DELETED at rv 7
	d.put("q", db, "")  // 8
	d.del("q")          // 9: deleted while not matching: nothing

	want := []objecttest.Got{
		{Type: watch.Added, Name: "p", RV: "3"}, {Type: watch.Modified, Name: "p", RV: "4"}, {Type: watch.Deleted, Name: "p", RV: "5"},
		{Type: watch.Added, Name: "p", RV: "6"}, {Type: watch.Deleted, Name: "p", RV: "7"},
	}
	if g := objecttest.Receive(t, w, len(want)); fmt.Sprint(g) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", g, want)
	}
	expectNothing(t, w)
	// The leaving object keeps its previous (matching) labels.
	d.put("r", web, "")
	d.put("r", db, "")
	objecttest.Receive(t, w, 1)
	e, _ := testkit.Recv(t, w.ch, "the leaving event")
	if e.Type != watch.Deleted || objecttest.MetaOf(t, e.Object).GetLabels()["app"] != "web" {
		t.Fatalf("leaving event %s carries labels %v, want the previous app=web", e.Type, objecttest.MetaOf(t, e.Object).GetLabels())
	}
}

func TestTriggerIndex(t *testing.T) {
	d := newTestDispatcher(100)
	onNode := func(n string) storage.SelectionPredicate {
		return storage.SelectionPredicate{Label: labels.Everything(), Field: fields.OneTermEqualSelector("spec.nodeName", n)}
	}
	a := d.watch(t, onNode("node-a"), 16)
	b := d.watch(t, onNode("node-b"), 16)
	all := d.watch(t, storage.Everything, 16)

	d.mu.Lock()
	setLen := func(kind placeKind, value string) int {
		if s := d.synced.sets[kind][value]; s != nil {
			return len(s.ws)
		}
		return 0
	}
	lists := fmt.Sprintf("all=%d node-a=%d node-b=%d", setLen(byPrefix, "/pods/"), setLen(byTrigger, "node-a"), setLen(byTrigger, "node-b"))
	d.mu.Unlock()
	if lists != "all=1 node-a=1 node-b=1" {
		t.Fatalf("watcher lists: %s", lists)
	}

	d.put("p", nil, "node-a")
	if g := objecttest.Receive(t, a, 1); g[0].Type != watch.Added {
		t.Fatalf("node-a watcher got %v", g)
	}
	objecttest.Receive(t, all, 1)
	expectNothing(t, b)

	// Moving an object from node-a to node-b tells both.
	d.put("p", nil, "node-b")
	if g := objecttest.Receive(t, a, 1); g[0].Type != watch.Deleted {
		t.Fatalf("node-a watcher got %v, want DELETED", g)
	}
	if g := objecttest.Receive(t, b, 1); g[0].Type != watch.Added {
		t.Fatalf("node-b watcher got %v, want ADDED", g)
	}

	// Stopping removes watchers from their lists.
	a.Stop()
	b.Stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.synced.sets[byTrigger]) != 0 {
		t.Fatalf("stopped watchers left in the trigger index: %v", d.synced.sets[byTrigger])
	}
}

func TestSlowWatcherCatchesUp(t *testing.T) {
	d := newTestDispatcher(1000)
	parkedBefore, err := testutil.GetCounterMetricValue(d.metrics.Parked)
	if err != nil {
		t.Fatal(err)
	}
	slow := d.watch(t, storage.Everything, 1)
	fast := d.watch(t, storage.Everything, 1000)
	const n = 200
	for i := 0; i < n; i++ {
		d.put(fmt.Sprintf("p%03d", i), nil, "")
	}
	// The fast watcher got every event without waiting for the slow one.
	if g := objecttest.Receive(t, fast, n); g[n-1].Name != "p199" {
		t.Fatalf("fast watcher's last event: %v", g[n-1])
	}
	d.mu.Lock()
	_, lagging := d.lagging[slow]
	d.mu.Unlock()
	if !lagging {
		t.Fatal("a watcher with a full channel must be catching up")
	}
	if parked, _ := testutil.GetCounterMetricValue(d.metrics.Parked); parked <= parkedBefore {
		t.Fatalf("cached_apiserver_watch_cache_parked_watchers_total stayed at %v", parked)
	}
	// The slow one gets them all too, in order, from the log.
	g := objecttest.Receive(t, slow, n)
	for i, e := range g {
		if want := fmt.Sprintf("p%03d", i); e.Name != want || e.Type != watch.Added {
			t.Fatalf("slow watcher event %d: %v, want ADDED %s", i, e, want)
		}
	}
	// Once caught up it is synced again and gets new events directly.
	// Nothing signals the move back, so poll for it.
	err = wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return slow.state == synced, nil
	})
	if err != nil {
		t.Fatal("caught-up watcher never synced")
	}
	d.put("late", nil, "")
	if g := objecttest.Receive(t, slow, 1); g[0].Name != "late" {
		t.Fatalf("after catching up got %v", g)
	}
}

// TestParkedAgainRightAfterSyncing has watchers with one-event buffers
// whose consumers keep just pace, so they are parked and synced over and
// over. A catch-up goroutine that has handed its watcher back must not
// touch it again, even when the dispatcher parks it at once and starts
// another: the 10,000-watcher benchmark found one that closed the channel
// under its successor ("send on closed channel").
func TestParkedAgainRightAfterSyncing(t *testing.T) {
	d := newTestDispatcher(100_000)
	const watchers, n = 50, 2000
	ws := make([]*Watcher, watchers)
	for i := range ws {
		ws[i] = d.watch(t, storage.Everything, 1)
	}
	results := make(chan error, watchers)
	for _, w := range ws {
		go func() {
			for i := 0; i < n; i++ {
				var e watch.Event
				var ok bool
				select {
				case e, ok = <-w.ResultChan():
				case <-time.After(wait.ForeverTestTimeout):
					results <- fmt.Errorf("no event %d within %v", i, wait.ForeverTestTimeout)
					return
				}
				if !ok {
					results <- fmt.Errorf("channel closed after %d events", i)
					return
				}
				if name := objecttest.MetaOf(t, e.Object).GetName(); name != fmt.Sprintf("p%04d", i) {
					results <- fmt.Errorf("event %d is %s", i, name)
					return
				}
				goruntime.Gosched() // just slower than the writer, now and then
			}
			results <- nil
		}()
	}
	for i := 0; i < n; i++ {
		d.put(fmt.Sprintf("p%04d", i), nil, "")
	}
	for range ws {
		if err, _ := testkit.Recv(t, results, "a watcher's result"); err != nil {
			t.Fatal(err)
		}
	}
	if parked, _ := testutil.GetCounterMetricValue(d.metrics.Parked); parked < watchers {
		t.Fatalf("only %v parks: the test did not exercise parking", parked)
	}
}

func TestWatcherFallsOffTheLog(t *testing.T) {
	d := newTestDispatcher(8)
	slow := d.watch(t, storage.Everything, 1)
	for i := 0; i < 30; i++ {
		d.put(fmt.Sprintf("p%02d", i), nil, "")
	}
	// It receives what it can, then a 410, then the channel closes.
	var last watch.Event
	for {
		e, ok := testkit.Recv(t, slow.ResultChan(), "the slow watcher's events and end")
		if !ok {
			break
		}
		last = e
	}
	status, ok := last.Object.(*metav1.Status)
	if last.Type != watch.Error || !ok || status.Code != 410 || status.Reason != metav1.StatusReasonExpired {
		t.Fatalf("last event %s %#v, want a 410 Expired error", last.Type, last.Object)
	}
}

func TestWatchFromTooOldResourceVersion(t *testing.T) {
	d := newTestDispatcher(4)
	for i := 0; i < 10; i++ {
		d.put(fmt.Sprintf("p%d", i), nil, "")
	}
	w := mustWatcher(t, d.Dispatcher, "/pods/", true, storage.Everything, 4)
	wi, err := d.Register(w, Start{From: 2})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := testkit.Recv(t, wi.ResultChan(), "the 410")
	if status, ok := e.Object.(*metav1.Status); e.Type != watch.Error || !ok || status.Code != 410 {
		t.Fatalf("got %s %v, want a 410 error", e.Type, e.Object)
	}
	if _, open := testkit.Recv(t, wi.ResultChan(), "the end after the 410"); open {
		t.Fatal("the watch must end after the error")
	}
}

func TestBookmarks(t *testing.T) {
	d := newTestDispatcher(100)
	pred := storage.Everything
	pred.AllowWatchBookmarks = true
	w := d.watch(t, pred, 16)
	d.put("p", nil, "")
	objecttest.Receive(t, w, 1)
	d.Progress(42)

	d.clock.Step(59 * time.Second)
	d.SendBookmarks(d.clock.Now())
	expectNothing(t, w)

	d.clock.Step(2 * time.Second)
	d.SendBookmarks(d.clock.Now())
	if got := objecttest.Receive(t, w, 1); got[0].Type != watch.Bookmark || got[0].RV != "42" {
		t.Fatalf("got %v, want a BOOKMARK at the head, 42", got)
	}
	// A minute later the head has not moved: the client holds it, and a
	// bookmark would tell it nothing. Idle watchers cost nothing.
	d.clock.Step(61 * time.Second)
	d.SendBookmarks(d.clock.Now())
	expectNothing(t, w)
	// Once the head moves, the next goes at the next due time, a minute
	// after the one skipped.
	d.Progress(50)
	d.clock.Step(61 * time.Second)
	d.SendBookmarks(d.clock.Now())
	if got := objecttest.Receive(t, w, 1); got[0].Type != watch.Bookmark || got[0].RV != "50" {
		t.Fatalf("got %v, want the second BOOKMARK, at 50", got)
	}
}

// TestBookmarkSkipsWhatTheClientHolds checks that a periodic bookmark goes
// only to a watcher whose client does not hold the head yet: not one that
// watched from the head, nor one just sent an event at it; but one whose
// events were all filtered out while the head moved, which is what
// bookmarks are for.
func TestBookmarkSkipsWhatTheClientHolds(t *testing.T) {
	d := newTestDispatcher(100)
	withBookmarks := func(p storage.SelectionPredicate) storage.SelectionPredicate {
		p.AllowWatchBookmarks = true
		return p
	}
	fromHead := d.watch(t, withBookmarks(storage.Everything), 16)
	sentHead := d.watch(t, withBookmarks(storage.Everything), 16)
	filtered := d.watch(t, withBookmarks(storage.SelectionPredicate{Label: labels.SelectorFromSet(labels.Set{"app": "none"}),
		Field: fields.Everything()}), 16)
	d.clock.Step(61 * time.Second)
	d.SendBookmarks(d.clock.Now())
	for name, w := range map[string]*Watcher{"from the head": fromHead, "sent the head": sentHead, "filtered": filtered} {
		if len(w.ch) != 0 {
			t.Fatalf("%s: a bookmark before the head moved", name)
		}
	}
	d.put("p", nil, "")
	objecttest.Receive(t, sentHead, 1)
	objecttest.Receive(t, fromHead, 1)
	d.clock.Step(61 * time.Second)
	d.SendBookmarks(d.clock.Now())
	expectNothing(t, fromHead)
	expectNothing(t, sentHead)
	if got := objecttest.Receive(t, filtered, 1); got[0].Type != watch.Bookmark || got[0].RV != fmt.Sprint(d.rv) {
		t.Fatalf("filtered: got %v, want a bookmark at %d", got, d.rv)
	}
}

func TestNextBookmarkTime(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name     string
		deadline time.Time
		want     time.Time
	}{
		{name: "no deadline", want: now.Add(time.Minute)},
		{name: "far deadline", deadline: now.Add(10 * time.Minute), want: now.Add(time.Minute)},
		{name: "near deadline", deadline: now.Add(10 * time.Second), want: now.Add(8 * time.Second)},
		{name: "deadline too close", deadline: now.Add(time.Second), want: time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextBookmarkTime(now, tc.deadline, time.Minute); !got.Equal(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCompactedDropsHistory(t *testing.T) {
	d := newTestDispatcher(100)
	for i := 0; i < 5; i++ {
		d.put(fmt.Sprintf("p%d", i), nil, "") // rv 2..6
	}
	// As the etcd3 store answers: a watch from before the compaction's
	// revision gets 410, one from it the events after.
	d.Compacted(4)
	if since, _ := d.log.Bounds(); since != 4 {
		t.Fatalf("after compaction at 4 the log starts at %d, want 4", since)
	}
	from4 := mustWatcher(t, d.Dispatcher, "/pods/", true, storage.Everything, 4)
	wi, _ := d.Register(from4, Start{From: 4})
	if got := objecttest.Receive(t, wi, 1); got[0].Type != watch.Added || got[0].RV != "5" {
		t.Fatalf("watch from 4 after compaction at 4: got %v, want the event at 5", got)
	}
	from4.Stop()
	w := mustWatcher(t, d.Dispatcher, "/pods/", true, storage.Everything, 4)
	wi, _ = d.Register(w, Start{From: 3})
	if e, _ := testkit.Recv(t, wi.ResultChan(), "the 410"); e.Type != watch.Error {
		t.Fatalf("watch from before the compaction: got %s, want a 410 error", e.Type)
	}
	// A compaction past the head drops only what the cache holds.
	d.Compacted(100)
	if since, head := d.log.Bounds(); since != head || head != 6 {
		t.Fatalf("after compaction past the head: since=%d head=%d, want 6 6", since, head)
	}
}

// TestBookmarksOnShutdown checks that once the server begins to shut down,
// every watcher that accepts bookmarks has one at the head, those open
// before and those registered after, so that none ends with nothing
// delivered; a watcher that asked for none gets none.
func TestBookmarksOnShutdown(t *testing.T) {
	d := newTestDispatcher(64)
	d.put("a", nil, "n1")
	withBookmarks := storage.Everything
	withBookmarks.AllowWatchBookmarks = true
	before := d.watch(t, withBookmarks, 10)
	triggered := d.watch(t, storage.SelectionPredicate{Label: labels.Everything(), Field: fields.OneTermEqualSelector("spec.nodeName", "n1"),
		AllowWatchBookmarks: true}, 10)
	quiet := d.watch(t, storage.Everything, 10)

	d.beginShutdown()
	after := d.watch(t, withBookmarks, 10)
	for name, w := range map[string]*Watcher{"before": before, "trigger-indexed": triggered, "after": after} {
		if got := objecttest.Receive(t, w, 1); got[0].Type != watch.Bookmark || got[0].RV != fmt.Sprint(d.rv) {
			t.Errorf("%s: got %v, want a bookmark at %d", name, got, d.rv)
		}
	}
	expectNothing(t, quiet)
}

// TestDeadlineBookmarkAlwaysGoes checks that the bookmark before a watch's
// deadline goes even to a watcher that holds the head, as upstream's
// conformance (OptionalWatchBookmarksWithCorrectResourceVersion) expects.
func TestDeadlineBookmarkAlwaysGoes(t *testing.T) {
	d := newTestDispatcher(100)
	pred := storage.Everything
	pred.AllowWatchBookmarks = true
	w := mustWatcher(t, d.Dispatcher, "/pods/", true, pred, 16)
	w.Deadline = d.clock.Now().Add(10 * time.Second).UnixNano()
	if _, err := d.Register(w, Start{From: d.rv}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	d.put("p", nil, "")
	objecttest.Receive(t, w, 1)
	d.clock.Step(8 * time.Second)
	d.SendBookmarks(d.clock.Now())
	if got := objecttest.Receive(t, w, 1); got[0].Type != watch.Bookmark || got[0].RV != fmt.Sprint(d.rv) {
		t.Fatalf("got %v, want the deadline's bookmark at %d", got, d.rv)
	}
}

// TestBookmarksShareOneEncoding checks that watchers sent a bookmark at the
// same resourceVersion get one Caching, so that the watch handlers
// encode it once, and that a later head gets a new one.
func TestBookmarksShareOneEncoding(t *testing.T) {
	d := newTestDispatcher(100)
	pred := storage.Everything
	pred.AllowWatchBookmarks = true
	a, b := d.watch(t, pred, 16), d.watch(t, pred, 16)
	d.Progress(42)
	d.clock.Step(61 * time.Second)
	d.SendBookmarks(d.clock.Now())
	var objs []runtime.Object
	for _, w := range []*Watcher{a, b} {
		select {
		case e := <-w.ch:
			if _, ok := e.Object.(runtime.CacheableObject); e.Type != watch.Bookmark || !ok {
				t.Fatalf("got %s %T, want a BOOKMARK that caches its encodings", e.Type, e.Object)
			}
			objs = append(objs, e.Object)
		case <-time.After(wait.ForeverTestTimeout):
			t.Fatal("no bookmark")
		}
	}
	if objs[0] != objs[1] {
		t.Fatal("two watchers got two bookmark objects at one resourceVersion")
	}
	d.Progress(43)
	d.mu.Lock()
	later := d.sharedBookmarkLocked(43)
	d.mu.Unlock()
	if rv := objecttest.DecodedPod(t, later).ResourceVersion; later == objs[0] || rv != "43" {
		t.Fatalf("the bookmark at 43 is %v at %s", later == objs[0], rv)
	}
}

// TestChannelSizedForInitialEvents: a watcher with more initial events
// than its buffer gets a channel with room for them, up to
// initialBuffer; any other keeps its buffer.
func TestChannelSizedForInitialEvents(t *testing.T) {
	onNode := storage.SelectionPredicate{Label: labels.Everything(), Field: fields.OneTermEqualSelector("spec.nodeName", "node-a")}
	for _, tc := range []struct {
		name      string
		objects   int
		key       string
		recursive bool
		pred      storage.SelectionPredicate
		start     Start
		want      int
	}{
		{name: "more than initialBuffer", objects: 300, key: "/pods/", recursive: true, pred: storage.Everything, start: Start{Initial: true}, want: initialBuffer},
		{name: "more than the buffer", objects: 20, key: "/pods/", recursive: true, pred: storage.Everything, start: Start{Initial: true}, want: 20},
		{name: "fewer than the buffer", objects: 5, key: "/pods/", recursive: true, pred: storage.Everything, start: Start{Initial: true}, want: 10},
		{name: "one key", objects: 300, key: "/pods/ns/p7", pred: storage.Everything, start: Start{Initial: true}, want: 10},
		{name: "other namespace", objects: 300, key: "/pods/other/", recursive: true, pred: storage.Everything, start: Start{Initial: true}, want: 10},
		{name: "trigger index", objects: 300, key: "/pods/", recursive: true, pred: onNode, start: Start{Initial: true}, want: 30},
		{name: "no initial events", objects: 300, key: "/pods/", recursive: true, pred: storage.Everything, start: Start{AtHead: true}, want: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDispatcher(1000)
			d.store = store.New[*Event](map[string]func(*object.Object) []string{
				storage.FieldIndex("spec.nodeName"): func(o *object.Object) []string { return []string{o.Trigger} }})
			d.Reset(nil, 1)
			for i := range tc.objects {
				// One in ten on node-a.
				d.put(fmt.Sprintf("p%d", i), nil, fmt.Sprintf("node-%c", 'a'+i%10))
			}
			w := mustWatcher(t, d.Dispatcher, tc.key, tc.recursive, tc.pred, 10)
			if _, err := d.Register(w, tc.start); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Stop)
			if got := cap(w.ResultChan()); got != tc.want {
				t.Errorf("channel of %d events, want %d", got, tc.want)
			}
		})
	}
}
