package cacher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	etcd3metrics "k8s.io/apiserver/pkg/storage/etcd3/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// faultyStore wraps the real etcd3 store so that a test can fail its
// reads of etcd's revision. Everything else is etcd's.
type faultyStore struct {
	storage.Interface
	// currentRevErr, when set, fails GetCurrentResourceVersion.
	currentRevErr atomic.Pointer[error]
	// revReads counts GetCurrentResourceVersion calls.
	revReads atomic.Int64
}

func (s *faultyStore) GetCurrentResourceVersion(ctx context.Context) (uint64, error) {
	s.revReads.Add(1)
	if err := s.currentRevErr.Load(); err != nil {
		return 0, *err
	}
	return s.Interface.GetCurrentResourceVersion(ctx)
}

// faultyChanges wraps the etcd changes the cache follows so that a test
// can break the cache's etcd watch the ways etcd does: end it with an
// error, close it, or make it go silent like a blackholed connection.
// Everything else is etcd's.
type faultyChanges struct {
	inner source.Changes
	// startSilent makes every new watch silent from its start.
	startSilent atomic.Bool

	// mu guards watches.
	mu      sync.Mutex
	watches []*faultyWatch
}

func (f *faultyChanges) Watch(ctx context.Context, rev uint64) source.ChangeStream {
	w := &faultyWatch{inner: f.inner.Watch(ctx, rev), ch: make(chan source.Response), fail: make(chan *source.End, 1),
		done: make(chan struct{})}
	w.silent.Store(f.startSilent.Load())
	go w.forward()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watches = append(f.watches, w)
	return w
}

// open returns how many of the watches the cache opened it has not closed.
func (f *faultyChanges) open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.watches {
		select {
		case <-w.done:
		default:
			n++
		}
	}
	return n
}

// count returns how many watches the cache opened.
func (f *faultyChanges) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watches)
}

// last returns the watch the cache opened last.
func (f *faultyChanges) last() *faultyWatch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.watches[len(f.watches)-1]
}

// faultyWatch forwards the real watch until told to fail.
type faultyWatch struct {
	inner source.ChangeStream
	ch    chan source.Response
	// fail ends the watch with the end sent, or closes it for nil.
	fail      chan *source.End
	silent    atomic.Bool
	done      chan struct{}
	closeOnce sync.Once
}

func (w *faultyWatch) Responses() <-chan source.Response { return w.ch }

func (w *faultyWatch) RequestProgress(ctx context.Context) error { return w.inner.RequestProgress(ctx) }

func (w *faultyWatch) Close() {
	w.closeOnce.Do(func() { close(w.done) })
	w.inner.Close()
}

func (w *faultyWatch) forward() {
	defer close(w.ch)
	for {
		select {
		case <-w.done:
			return
		case end := <-w.fail:
			if end != nil {
				select {
				case w.ch <- source.Response{End: end}:
				case <-w.done:
				}
			}
			return
		case r, ok := <-w.inner.Responses():
			if !ok {
				return
			}
			if w.silent.Load() {
				// A blackhole: nothing arrives. etcd still has it all.
				continue
			}
			select {
			case w.ch <- r:
			case <-w.done:
				return
			}
		}
	}
}

// faults are what a faulty cache's test breaks.
type faults struct {
	store   *faultyStore
	changes *faultyChanges
	conns   *fakeConnections
	clk     *testingclock.FakeClock
}

// withFaults has the cache read etcd through f's faulty store and changes.
func withFaults(f *faults) setupOption {
	return func(o *setupOptions) {
		o.wrap = func(s storage.Interface) storage.Interface { f.store.Interface = s; return f.store }
		o.changes = func(c source.Changes) source.Changes { f.changes.inner = c; return f.changes }
	}
}

// newFaultyCacher returns a ready cache over a faulty store and changes,
// on a fake clock, with its quiet connections dropped through a
// fakeConnections.
func newFaultyCacher(t *testing.T) (*testCacher, *faults) {
	t.Helper()
	f := &faults{store: &faultyStore{}, changes: &faultyChanges{}, clk: testingclock.NewFakeClock(time.Now())}
	f.conns = &fakeConnections{open: f.changes.open}
	c := newTestCacher(t, withFaults(f), func(o *setupOptions) {
		o.config = func(cfg *Config) { cfg.Clock = f.clk; cfg.Connections = f.conns }
	})
	waitReady(t, c.Cacher)
	// The cache is ready once it has listed; it opens its etcd watch
	// after that, and the tests break the watch it opened.
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return f.changes.count() > 0, nil }); err != nil {
		t.Fatalf("the cache opened no etcd watch after it was ready: %v", err)
	}
	return c, f
}

// TestEtcdWatchFailures checks what the cache does when its etcd watch
// ends. Every failure that loses no history must cost watchers nothing:
// the cache re-watches from its head and they get every event, in order,
// once. Only compaction of the head makes it re-list and end them with 410.
func TestEtcdWatchFailures(t *testing.T) {
	tests := []struct {
		name string
		// breakWatch breaks the cache's current etcd watch.
		breakWatch func(w *faultyWatch)
		reason     string
		relist     bool
		// dropsQuiet: the cache closes etcd's quiet connections before
		// re-watching, or its new watch would share the silent one.
		dropsQuiet bool
	}{{
		name:       "no leader",
		breakWatch: func(w *faultyWatch) { w.fail <- &source.End{Reason: source.EndNoLeader, Err: rpctypes.ErrNoLeader} },
		reason:     source.EndNoLeader,
	}, {
		name: "etcd unavailable",
		breakWatch: func(w *faultyWatch) {
			w.fail <- &source.End{Reason: source.EndUnavailable, Err: errors.New("rpc error: code = Unavailable desc = connection reset")}
		},
		reason: source.EndUnavailable,
	}, {
		name:       "closed without an error",
		breakWatch: func(w *faultyWatch) { w.fail <- nil },
		reason:     source.EndClosed,
	}, {
		name:       "silent",
		breakWatch: func(w *faultyWatch) { w.silent.Store(true) },
		reason:     source.EndSilent,
		dropsQuiet: true,
	}, {
		name: "compacted",
		breakWatch: func(w *faultyWatch) {
			w.fail <- &source.End{Reason: source.EndCompacted, Relist: true, Err: rpctypes.ErrCompacted}
		},
		reason: source.EndCompacted,
		relist: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c, f := newFaultyCacher(t)
			restarts := etcdWatchRestarts.WithLabelValues("", "pods", tc.reason)
			relists := relistsCounter.WithLabelValues("", "pods", tc.reason)
			gaps := etcdWatchGap.WithLabelValues("", "pods")
			gapsBefore, _ := testutil.GetHistogramMetricCount(gaps)
			restartsBefore, _ := testutil.GetCounterMetricValue(restarts)
			relistsBefore, _ := testutil.GetCounterMetricValue(relists)

			first := createPod(t, c, "a")
			w, err := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: first.ResourceVersion, Recursive: true, Predicate: storage.Everything})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			createPod(t, c, "b")
			expectNames(t, w, "b")

			tc.breakWatch(f.changes.last())
			// Writes go on while the cache's watch is down.
			createPod(t, c, "c")
			createPod(t, c, "d")
			testkit.StepUntil(t, f.clk, func() bool { return f.changes.count() > 1 })

			if tc.relist {
				ev := next(t, w)
				if ev.Type != watch.Error || ev.Object.(*metav1.Status).Code != 410 {
					t.Fatalf("after compaction of the head: got %v, want a 410 ERROR", ev)
				}
				if relisted, _ := testutil.GetCounterMetricValue(relists); relisted != relistsBefore+1 {
					t.Errorf("relists_total{reason=%s} = %v, want %v", tc.reason, relisted, relistsBefore+1)
				}
				return
			}
			// The same watcher gets every event after the fault, in order, once.
			expectNames(t, w, "c", "d")
			if quiets := f.conns.calls(); tc.dropsQuiet {
				// Silent 8 s after the last thing heard at most (source/silence.go).
				if len(quiets) != 1 || quiets[0] < DefaultProgressRequestInterval || quiets[0] > 8*time.Second {
					t.Errorf("DropQuiet called with %v, want once with a quiet of 5–8 s", quiets)
				}
				// Dropped as the silent watch ends, etcd's client could
				// re-create it on a new connection and leave it there.
				if open := f.conns.openWatches(); len(open) != 1 || open[0] != 0 {
					t.Errorf("DropQuiet called with %v etcd watches open, want once with none: after the silent one ended", open)
				}
			} else if len(quiets) > 0 {
				t.Errorf("DropQuiet called with %v after %s, want no call", quiets, tc.name)
			}
			if err := c.ReadinessCheck(); err != nil {
				t.Errorf("cache not ready after re-watching: %v", err)
			}
			if restarted, _ := testutil.GetCounterMetricValue(restarts); restarted != restartsBefore+1 {
				t.Errorf("etcd_watch_restarts_total{reason=%s} = %v, want %v", tc.reason, restarted, restartsBefore+1)
			}
			if relisted, _ := testutil.GetCounterMetricValue(relists); relisted != relistsBefore {
				t.Errorf("the cache re-listed after %s", tc.name)
			}
			if gapCount, _ := testutil.GetHistogramMetricCount(gaps); gapCount != gapsBefore+1 {
				t.Errorf("etcd_watch_gap_seconds has %v observations, want %v", gapCount, gapsBefore+1)
			}
			createPod(t, c, "e")
			expectNames(t, w, "e")
		})
	}
}

// TestIdleEtcdWatchStaysOpen checks that the cache's watch of an etcd with
// no writes is not found silent. etcd does not answer a progress request
// while its revision is below a watch's start, and the cache's watch
// starts one past the revision it listed at: on an idle etcd its progress
// requests go unanswered. The cache found it silent every 8 s, re-watched,
// and closed its connections to etcd each time. It now asks etcd's
// revision first, and keeps the watch when etcd has nothing newer.
func TestIdleEtcdWatchStaysOpen(t *testing.T) {
	c, f := newFaultyCacher(t)
	restarts := etcdWatchRestarts.WithLabelValues("", "pods", source.EndSilent)
	restartsBefore, _ := testutil.GetCounterMetricValue(restarts)

	// Three progress request intervals with no write: the cache asks
	// etcd's revision after each unanswered request.
	testkit.StepUntil(t, f.clk, func() bool { return f.store.revReads.Load() >= 3 })
	if n := f.changes.count(); n != 1 {
		t.Errorf("the cache opened %d etcd watches over an idle etcd, want 1", n)
	}
	if quiets := f.conns.calls(); len(quiets) > 0 {
		t.Errorf("DropQuiet called with %v over an idle etcd, want no call", quiets)
	}
	if restarted, _ := testutil.GetCounterMetricValue(restarts); restarted != restartsBefore {
		t.Errorf("etcd_watch_restarts_total{reason=silent} = %v, want %v", restarted, restartsBefore)
	}
	// The watch kept still works.
	w, err := c.Watch(context.Background(), "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	createPod(t, c, "a")
	expectNames(t, w, "a")
}

// TestIdleEtcdRewatchEndsOutage checks that a watch re-opened over an
// idle etcd ends the outage a tick after it opens, once etcd confirms it
// has nothing newer, not an interval later when the silence check would.
func TestIdleEtcdRewatchEndsOutage(t *testing.T) {
	c, f := newFaultyCacher(t)
	gaps := etcdWatchGap.WithLabelValues("", "pods")
	gapsBefore, _ := testutil.GetHistogramMetricCount(gaps)
	sumBefore, _ := testutil.GetHistogramMetricValue(gaps)

	f.changes.last().fail <- nil // closed, with no write before or after
	testkit.StepUntil(t, f.clk, func() bool {
		n, _ := testutil.GetHistogramMetricCount(gaps)
		return f.changes.count() > 1 && n > gapsBefore
	})
	sum, _ := testutil.GetHistogramMetricValue(gaps)
	// The re-watch waits 25 ms, and the first tick comes a second after it.
	if gap := time.Duration((sum - sumBefore) * float64(time.Second)); gap > 2*time.Second {
		t.Errorf("the outage lasted %v on the fake clock, want at most 2s: it ended only with the silence check", gap)
	}
	if err := c.ReadinessCheck(); err != nil {
		t.Errorf("cache not ready after re-watching: %v", err)
	}
}

// fakeConnections records what the cache asks its ConnectionDropper.
type fakeConnections struct {
	// open, if set, counts the etcd watches open.
	open func() int
	// mu guards quiets and openAtDrop.
	mu     sync.Mutex
	quiets []time.Duration
	// openAtDrop is how many etcd watches were open at each call.
	openAtDrop []int
}

func (f *fakeConnections) DropQuiet(quiet time.Duration) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.quiets = append(f.quiets, quiet)
	if f.open != nil {
		f.openAtDrop = append(f.openAtDrop, f.open())
	}
	return 1
}

func (f *fakeConnections) openWatches() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.openAtDrop)
}

func (f *fakeConnections) calls() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.quiets)
}

// TestConsistentReadWithoutCurrentRevision checks that a consistent read
// fails with 503 and Retry-After while etcd cannot give its revision, as
// while its member has no leader, and that reads allowing staleness and
// watches are still served.
func TestConsistentReadWithoutCurrentRevision(t *testing.T) {
	ctx := context.Background()
	store := &faultyStore{}
	c := newTestCacher(t, func(o *setupOptions) {
		o.wrap = func(s storage.Interface) storage.Interface { store.Interface = s; return store }
	})
	waitReady(t, c.Cacher)
	first := createPod(t, c, "a")
	rv, _ := c.cfg.Versioner.ParseResourceVersion(first.ResourceVersion)
	if err := c.d.WaitFor(ctx, rv, wait.ForeverTestTimeout, c.requestProgress); err != nil {
		t.Fatal(err)
	}
	noLeader := error(rpctypes.ErrNoLeader)
	store.currentRevErr.Store(&noLeader)

	err := c.GetList(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: storage.Everything}, &example.PodList{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("consistent list without etcd's revision: got %v, want 503", err)
	}
	if seconds, ok := apierrors.SuggestsClientDelay(err); !ok || seconds < 1 {
		t.Errorf("503 without Retry-After: %v", err)
	}
	stale := &example.PodList{}
	if err := c.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, stale); err != nil || len(stale.Items) != 1 {
		t.Errorf("list at resourceVersion 0: %d items, %v; want the cached pod", len(stale.Items), err)
	}
	opts := storage.ListOptions{ResourceVersion: first.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		Recursive: true, Predicate: storage.Everything}
	if err := c.GetList(ctx, "/pods/", opts, &example.PodList{}); err != nil {
		t.Errorf("list not older than a resourceVersion the cache holds: %v", err)
	}
	w, err := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: first.ResourceVersion, Recursive: true, Predicate: storage.Everything})
	if err != nil {
		t.Fatalf("watch from a cached resourceVersion: %v", err)
	}
	w.Stop()
}

// TestConsistentReadsAskTheCacheConnection fails every read of etcd's
// revision through the store, as while the store's connection to a
// restarted member waits out gRPC's backoff, and checks that consistent
// reads, and GetCurrentResourceVersion, are served all the same: they read
// the revision through the cache's own client, the one its watch hears
// etcd on.
func TestConsistentReadsAskTheCacheConnection(t *testing.T) {
	ctx := context.Background()
	store := &faultyStore{}
	c := newTestCacher(t, func(o *setupOptions) {
		o.wrap = func(s storage.Interface) storage.Interface { store.Interface = s; return store }
		o.config = func(cfg *Config) { cfg.readRevision = nil } // the default
	})
	waitReady(t, c.Cacher)
	etcd3metrics.Register() // as the server registers it: a metric counts once registered
	readsBefore := etcdRevisionReads(t, "pods")
	unavailable := error(status.Error(codes.Unavailable, "connection reset by peer"))
	store.currentRevErr.Store(&unavailable)
	created := createPod(t, c, "a")
	list := &example.PodList{}
	if err := c.GetList(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: storage.Everything}, list); err != nil {
		t.Fatalf("consistent list while the store cannot read etcd's revision: %v", err)
	}
	listRV, _ := c.cfg.Versioner.ParseResourceVersion(list.ResourceVersion)
	createdRV, _ := c.cfg.Versioner.ParseResourceVersion(created.ResourceVersion)
	if listRV < createdRV || len(list.Items) != 1 {
		t.Fatalf("consistent list at %s with %d items, want at least %s with the pod created", list.ResourceVersion, len(list.Items), created.ResourceVersion)
	}
	// storage.Interface's own revision read goes the same way.
	if rv, err := c.GetCurrentResourceVersion(ctx); err != nil || rv < createdRV {
		t.Errorf("GetCurrentResourceVersion while the store cannot read it: %d, %v; want at least %d", rv, err, createdRV)
	}
	if n := store.revReads.Load(); n != 0 {
		t.Errorf("the cache read etcd's revision through the store %d times, want none", n)
	}
	// Counted as the store counts its own, for the dashboards that graph it.
	if n := etcdRevisionReads(t, "pods") - readsBefore; n == 0 {
		t.Error("etcd_requests_total counts no getCurrentResourceVersion of pods")
	}
}

// etcdRevisionReads returns etcd_requests_total's getCurrentResourceVersion
// count for resource, from the registry the server serves /metrics from.
func etcdRevisionReads(t *testing.T, resource string) float64 {
	t.Helper()
	return counterSum(t, "etcd_requests_total", map[string]string{"operation": "getCurrentResourceVersion", "resource": resource})
}

// counterSum returns the sum of the counters named name whose labels
// include want, from the registry the server serves /metrics from.
func counterSum(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// TestDirectReadsCounted: the cache's own reads of etcd, which go around
// the etcd3 store, count in the store's metrics as the store's reads
// would, so that the dashboards graphing them see the cache's share: each
// page of a list read as a range is an etcd request (listStream), so is
// its read of the keys (listOnlyKeys), and each event its watch receives
// is an event received.
func TestDirectReadsCounted(t *testing.T) {
	etcd3metrics.Register() // as the server registers it: a metric counts once registered
	c := newTestCacher(t, withKeyReader(testingclock.NewFakeClock(time.Now()), time.Hour))
	for i := range 10 {
		createPod(t, c, fmt.Sprintf("p%02d", i))
	}
	streams := func() float64 {
		return counterSum(t, "etcd_requests_total", map[string]string{"operation": "listStream", "resource": "pods"})
	}
	events := func() float64 {
		return counterSum(t, "apiserver_storage_events_received_total", map[string]string{"resource": "pods"})
	}
	keyReads := func() float64 {
		return counterSum(t, "etcd_requests_total", map[string]string{"operation": "listOnlyKeys", "resource": "pods"})
	}
	streamsBefore, keyReadsBefore := streams(), keyReads()
	pages := &pageLimits{}
	restarted := restartCache(t, c, func(cfg *Config) {
		pages.wrap(cfg)
		cfg.listPageSize = 3
		cfg.WarmStartRevisions = -1 // no backfill, which reads more
	})
	pages.mu.Lock()
	ranges := len(pages.limits)
	pages.mu.Unlock()
	if n := streams() - streamsBefore; ranges == 0 || n < float64(ranges) {
		t.Errorf("etcd_requests_total counts %v listStream requests of pods, want at least the %d ranges read", n, ranges)
	}
	// The list read the keys, beside its first page, to know its pages.
	if n := keyReads() - keyReadsBefore; n < 1 {
		t.Errorf("etcd_requests_total counts %v listOnlyKeys requests of pods, want the list's read of its keys", n)
	}
	eventsBefore := events()
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "ns"}}
	if err := restarted.Create(context.Background(), "/pods/ns/new", pod, &example.Pod{}, 0); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return events() > eventsBefore, nil
	})
	if err != nil {
		t.Error("apiserver_storage_events_received_total counts no event of pods 10 s after a create")
	}
}

func createPod(t *testing.T, c *testCacher, name string) *example.Pod {
	t.Helper()
	out := &example.Pod{}
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	if err := c.Create(context.Background(), "/pods/ns/"+name, pod, out, 0); err != nil {
		t.Fatal(err)
	}
	return out
}

func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	ev, ok := testkit.Recv(t, w.ResultChan(), "no event")
	if !ok {
		t.Fatal("watch ended")
	}
	return ev
}

// expectNames reads one ADDED event per name, in order.
func expectNames(t *testing.T, w watch.Interface, names ...string) {
	t.Helper()
	for _, name := range names {
		ev := next(t, w)
		_, ok := ev.Object.(*object.Caching)
		if ev.Type != watch.Added || !ok || objecttest.DecodedPod(t, ev.Object).Name != name {
			t.Fatalf("got %s %v, want ADDED %s", ev.Type, ev.Object, name)
		}
	}
}
