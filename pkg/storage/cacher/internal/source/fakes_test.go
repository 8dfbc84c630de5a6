package source

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// The fakes at the source's two boundaries: the etcd3 store it reads, and
// the cache it fills.

// fakeEtcd is an etcd3 store whose state the test sets, and etcd's
// changes, whose watches the test drives: each Watch is handed to the test
// on watches.
type fakeEtcd struct {
	// mu guards pods, rev, at, streams and progress.
	mu   sync.Mutex
	pods []*example.Pod
	rev  uint64
	// at holds the state at older revisions, for exact lists; an exact
	// list at a revision it lacks reads the current state.
	at map[uint64][]*example.Pod
	// watches receives each watch opened, with the resourceVersion it
	// starts after.
	watches chan openedWatch
	// streams counts the watches opened, which number them.
	streams int
	// progress holds the watch of each progress request, in order.
	progress []int
	// failLists is how many lists, from now, fail as etcd not answering.
	failLists int
	// exactLists counts the lists at an exact revision, by revision.
	exactLists map[uint64]int
}

type openedWatch struct {
	w  *fakeStream
	rv string
	// stream numbers the watch, and its gRPC stream.
	stream int
}

func newFakeEtcd(rev uint64, pods ...*example.Pod) *fakeEtcd {
	return &fakeEtcd{pods: pods, rev: rev, watches: make(chan openedWatch, 10)}
}

// set replaces the state a list reads.
func (e *fakeEtcd) set(rev uint64, pods ...*example.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pods, e.rev = pods, rev
}

func (e *fakeEtcd) GetList(_ context.Context, _ string, opts storage.ListOptions, listObj runtime.Object) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failLists > 0 {
		e.failLists--
		return fmt.Errorf("etcd did not answer: %w", context.DeadlineExceeded)
	}
	list := listObj.(*example.PodList)
	pods, rev := e.pods, e.rev
	if opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact {
		rev, _ = strconv.ParseUint(opts.ResourceVersion, 10, 64)
		if e.exactLists == nil {
			e.exactLists = map[uint64]int{}
		}
		e.exactLists[rev]++
		if old, ok := e.at[rev]; ok {
			pods = old
		}
	}
	for _, p := range pods {
		list.Items = append(list.Items, *p.DeepCopy())
	}
	list.ResourceVersion = strconv.FormatUint(rev, 10)
	return nil
}

// Watch implements Changes.
func (e *fakeEtcd) Watch(_ context.Context, rev uint64) ChangeStream {
	e.mu.Lock()
	e.streams++
	s := &fakeStream{etcd: e, id: e.streams, ch: make(chan Response, 10), done: make(chan struct{})}
	e.mu.Unlock()
	e.watches <- openedWatch{w: s, rv: strconv.FormatUint(rev, 10), stream: s.id}
	return s
}

// listsAt returns how many lists at exactly rev were made.
func (e *fakeEtcd) listsAt(rev uint64) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.exactLists[rev]
}

// progressRequests returns the watch of each progress request so far.
func (e *fakeEtcd) progressRequests() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.progress...)
}

func (e *fakeEtcd) GetCurrentResourceVersion(context.Context) (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rev, nil
}
func (e *fakeEtcd) CompactRevision() int64 { return 0 }

// next returns the next watch the source opens.
func (e *fakeEtcd) next(t *testing.T) openedWatch {
	t.Helper()
	o, _ := testkit.Recv(t, e.watches, "the source's etcd watch")
	return o
}

// fakeStream is one watch of a fakeEtcd, whose responses the test sends.
type fakeStream struct {
	etcd *fakeEtcd
	id   int
	ch   chan Response
	// done is closed by Close.
	done      chan struct{}
	closeOnce sync.Once
}

func (s *fakeStream) Responses() <-chan Response { return s.ch }

func (s *fakeStream) RequestProgress(context.Context) error {
	s.etcd.mu.Lock()
	defer s.etcd.mu.Unlock()
	s.etcd.progress = append(s.etcd.progress, s.id)
	return nil
}

func (s *fakeStream) Close() { s.closeOnce.Do(func() { close(s.done) }) }

// send delivers r unless the watch is closed.
func (s *fakeStream) send(r Response) {
	select {
	case s.ch <- r:
	case <-s.done:
	}
}

// put sends one response with a put of each pod, at its resourceVersion.
func (s *fakeStream) put(pods ...*example.Pod) {
	var r Response
	for _, p := range pods {
		rev, _ := strconv.ParseUint(p.ResourceVersion, 10, 64)
		r.Changes = append(r.Changes, Change{Key: "/pods/" + p.Namespace + "/" + p.Name, Rev: rev, Object: p.DeepCopy()})
	}
	s.send(r)
}

// del sends one response with the deletion of each pod, at its
// resourceVersion, without its last value.
func (s *fakeStream) del(pods ...*example.Pod) {
	var r Response
	for _, p := range pods {
		rev, _ := strconv.ParseUint(p.ResourceVersion, 10, 64)
		r.Changes = append(r.Changes, Change{Key: "/pods/" + p.Namespace + "/" + p.Name, Rev: rev, Deleted: true})
	}
	s.send(r)
}

// end ends the watch with end.
func (s *fakeStream) end(end End) { s.send(Response{End: &end}) }

// stop ends the watch as etcd closing it does.
func (s *fakeStream) stop() { s.end(End{Reason: EndClosed, Err: fmt.Errorf("closed by the test")}) }

// fakeCache is the cache a source fills: its state, its head, and what it
// was told.
type fakeCache struct {
	// mu guards every field.
	mu   sync.Mutex
	objs map[string]*object.Object
	// since is where the history starts: the last list's revision.
	since  uint64
	head   uint64
	resets int
	events []*fanout.Event
	// revisions holds how many events each Process call had.
	revisions []int
	endings   []string
	// prepended receives what each PrependHistory was given, and
	// prependedFrom the revision it said the events follow.
	prepended     chan []*fanout.Event
	prependedFrom atomic.Uint64
}

func newFakeCache() *fakeCache {
	return &fakeCache{objs: map[string]*object.Object{}, prepended: make(chan []*fanout.Event, 1)}
}

func (c *fakeCache) Reset(objs []*object.Object, rv uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.objs = map[string]*object.Object{}
	for _, o := range objs {
		c.objs[o.Key] = o
	}
	c.since, c.head = rv, rv
	c.resets++
}

func (c *fakeCache) Process(rev ...*fanout.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range rev {
		if e.Type == watch.Deleted {
			delete(c.objs, e.Key)
		} else {
			c.objs[e.Key] = e.Cur
		}
		c.head = max(c.head, e.Rev)
		c.events = append(c.events, e)
	}
	c.revisions = append(c.revisions, len(rev))
}

func (c *fakeCache) Progress(rv uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.head = max(c.head, rv)
}

func (c *fakeCache) PrependHistory(events []*fanout.Event, from, _, _ uint64) bool {
	c.prependedFrom.Store(from)
	c.prepended <- events
	return true
}

func (c *fakeCache) EndAll(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endings = append(c.endings, reason)
}

func (c *fakeCache) Get(key string) (*object.Object, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.objs[key]
	return o, ok
}

// Latest is the state in a real store, for the consistency check.
func (c *fakeCache) Latest() store.Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	objs := make([]*object.Object, 0, len(c.objs))
	for _, o := range c.objs {
		objs = append(objs, o)
	}
	s := store.New[*fanout.Event](nil)
	s.Replace(objs, c.head)
	return s.Latest()
}

func (c *fakeCache) Bounds() (since, head uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.since, c.head
}

func (c *fakeCache) Resets() uint64 { return 0 }

func (c *fakeCache) Fillable(uint64) bool { return true }

// seen returns the events processed, as "TYPE key@rv".
func (c *fakeCache) seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, e := range c.events {
		out = append(out, fmt.Sprintf("%s %s@%d", e.Type, e.Key, e.Rev))
	}
	return out
}

func (c *fakeCache) lists() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resets
}

func (c *fakeCache) ended() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.endings...)
}

// counts keeps the source's metrics: counters and observations by name,
// and reasons by metric.
type counts struct {
	// mu guards n.
	mu sync.Mutex
	n  map[string]int
}

func (c *counts) add(name string) { c.addN(name, 1) }

func (c *counts) addN(name string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[name] += n
}

func (c *counts) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// counter is one named counter or observer of counts.
type counter struct {
	c    *counts
	name string
}

func (m counter) Inc()            { m.c.add(m.name) }
func (m counter) Add(n float64)   { m.c.addN(m.name, int(n)) }
func (m counter) Observe(float64) { m.c.add(m.name) }

func (c *counts) metrics() Metrics {
	return Metrics{
		Received: counter{c, "received"}, Replayed: counter{c, "replayed"},
		Listed: counter{c, "listed"}, ListFailed: counter{c, "list_failed"}, PageRetried: counter{c, "page_retried"},
		ListDuration: counter{c, "list_duration"}, Gap: counter{c, "gap"},
		Restarted:       func(r string) { c.add("restarted/" + r) },
		Relisted:        func(r string) { c.add("relisted/" + r) },
		Checked:         func(r string) { c.add("checked/" + r) },
		ResourceVersion: func(uint64) {},
		Backfill:        func(r string) { c.add("backfill/" + r) },
		BackfillEvents:  counter{c, "backfill_events"},
	}
}

// fakeKeys is a KeyReader over a fixed set of keys and revisions.
type fakeKeys map[string]int64

func (k fakeKeys) ReadKeys(_ context.Context, _ int64, fn func(string, int64)) (int64, error) {
	keys := make([]string, 0, len(k))
	for key := range k {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		fn(key, k[key])
	}
	return int64(len(keys)), nil
}

// harness is a Source over a fake etcd and a fake cache, on a fake clock.
type harness struct {
	src   *Source
	etcd  *fakeEtcd
	cache *fakeCache
	ready *Readiness
	n     *counts
	clk   *testingclock.FakeClock
}

func newHarness(etcd *fakeEtcd, keys KeyReader) *harness {
	return newHarnessWith(etcd, keys, nil)
}

// newHarnessWith is newHarness with cfg's changes to the source's Config.
func newHarnessWith(etcd *fakeEtcd, keys KeyReader, cfg func(*Config)) *harness {
	h := &harness{etcd: etcd, cache: newFakeCache(), ready: NewReadiness(nil), n: &counts{n: map[string]int{}},
		clk: testingclock.NewFakeClock(time.Now())}
	h.src = New(Config{Store: etcd, Changes: etcd, ResourcePrefix: "/pods/", GroupResource: schema.GroupResource{Resource: "pods"},
		NewListFunc: func() runtime.Object { return &example.PodList{} }, Versioner: storage.APIObjectVersioner{},
		Build: objecttest.Pods, Keys: keys, ListPageSize: ListPageSize, ListPageBytes: ListPageBytes,
		FreshnessTimeout: time.Second, ProgressRequestInterval: time.Hour, Clock: h.clk,
		Sink: h.cache, Objects: h.cache, History: h.cache, Ready: h.ready, Metrics: h.n.metrics()})
	if cfg != nil {
		c := h.src.cfg
		cfg(&c)
		h.src = New(c)
	}
	return h
}

// run runs the source until the test ends.
func (h *harness) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.src.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		testkit.Recv(t, done, "the source's end")
	})
}

// waitState waits for the readiness to reach s.
func (h *harness) waitState(t *testing.T, s State) {
	t.Helper()
	testkit.StepUntil(t, h.clk, func() bool { got, _ := h.ready.Get(); return got == s })
}

// pod is pod name in namespace ns at resourceVersion rv.
func pod(name string, rv uint64) *example.Pod {
	return &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: strconv.FormatUint(rv, 10)}}
}

// sameString tells whether a and b are the same bytes in memory, not only
// equal.
func sameString(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}
