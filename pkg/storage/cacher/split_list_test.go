package cacher

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	grpccodes "google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// countingKeys counts the key lists a cache reads, and closes started at
// the first.
type countingKeys struct {
	KeyReader
	reads   atomic.Int64
	started chan struct{}
}

func (k *countingKeys) ReadKeys(ctx context.Context, rev int64, fn func(string, int64)) (int64, error) {
	if k.reads.Add(1) == 1 {
		close(k.started)
	}
	return k.KeyReader.ReadKeys(ctx, rev, fn)
}

// pageLimits records the size of every page a cache reads after its
// first, from a continue token through the store or as a range of keys,
// and sums by the revision they are read at how many objects it decoded:
// every object of a page through the store, as every such page is exact;
// in a range, those the store does not hold (and, in ranged, every key
// the range held). With keysStarted, the first page waits for the keys'
// read to start, for up to 5 s, and says in overlapped whether it did:
// whether the two are read at once.
type pageLimits struct {
	storage.Interface
	keysStarted <-chan struct{}
	overlapped  atomic.Bool
	// mu guards limits, readAt and ranged.
	mu             sync.Mutex
	limits         []int64
	readAt, ranged map[int64]int64
}

// wrap makes p observe cfg's store and ranges.
func (p *pageLimits) wrap(cfg *Config) {
	p.Interface = cfg.Storage
	cfg.Storage = p
	cfg.wrapRanges = func(r source.RangeReader) source.RangeReader { return pageRanges{RangeReader: r, p: p} }
}

func (p *pageLimits) record(rev, objects, decoded int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limits = append(p.limits, objects)
	if p.readAt == nil {
		p.readAt, p.ranged = map[int64]int64{}, map[int64]int64{}
	}
	p.readAt[rev] += decoded
	p.ranged[rev] += objects
}

func (p *pageLimits) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	if opts.Predicate.Continue != "" {
		if _, rv, err := storage.DecodeContinue(opts.Predicate.Continue, "/pods/"); err == nil {
			p.record(rv, opts.Predicate.Limit, opts.Predicate.Limit)
		}
	} else if p.keysStarted != nil {
		select {
		case <-p.keysStarted:
			p.overlapped.Store(true)
		case <-time.After(5 * time.Second):
		}
	}
	return p.Interface.GetList(ctx, key, opts, listObj)
}

// pageRanges records the pages read as ranges of keys in p: how many
// objects each held, and how many of them the cache decoded.
type pageRanges struct {
	source.RangeReader
	p *pageLimits
}

func (r pageRanges) ReadRange(ctx context.Context, rev int64, from, to string, fn func(string, int64, func() (runtime.Object, error)) error) error {
	var n, decoded int64
	err := r.RangeReader.ReadRange(ctx, rev, from, to, func(key string, modRev int64, read func() (runtime.Object, error)) error {
		n++
		return fn(key, modRev, func() (runtime.Object, error) {
			decoded++
			return read()
		})
	})
	r.p.record(rev, n, decoded)
	return err
}

// TestListSplit restarts a cache over pods in pages of 3: with a
// KeyReader the pages after the first are read at once from where the keys
// say they start, and the keys are read while the first page is; without
// one, one after another. Either way the cache
// holds exactly etcd's state, in key order, at one revision. Pages read at
// once are smaller where the first page's objects say that 3 would hold
// more than listPageBytes.
func TestListSplit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pods      int
		keyReader bool
		keyReads  int64
		// pageBytes is listPageBytes, if set; then every page after the
		// first holds one object. Without it they hold up to 3, fewer
		// where the process has enough CPUs to read each at once.
		pageBytes int64
	}{
		// The keys are read beside the first page, before it is known
		// to hold every object.
		{name: "one page", pods: 3, keyReader: true, keyReads: 1},
		{name: "pages read at once", pods: 10, keyReader: true, keyReads: 1},
		{name: "whole pages read at once", pods: 9, keyReader: true, keyReads: 1},
		// Enough pods that without the bound each page would hold 2.
		{name: "pages bounded by their bytes", pods: 3 + 2*goruntime.GOMAXPROCS(0), keyReader: true, keyReads: 1, pageBytes: 1},
		{name: "pages one after another", pods: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cacherWithPods(t, tc.keyReader, tc.pods)
			var keys *countingKeys
			pages := &pageLimits{}
			restarted := restartCache(t, c, func(cfg *Config) {
				pages.wrap(cfg)
				cfg.listPageSize, cfg.listPageBytes = 3, tc.pageBytes
				cfg.WarmStartRevisions = -1 // no backfill, which lists again
				if cfg.KeyReader != nil {
					keys = &countingKeys{KeyReader: cfg.KeyReader, started: make(chan struct{})}
					cfg.KeyReader = keys
					pages.keysStarted = keys.started
				}
			})
			if keys != nil && keys.reads.Load() != tc.keyReads {
				t.Errorf("read the keys %d times, want %d", keys.reads.Load(), tc.keyReads)
			}
			if keys != nil && !pages.overlapped.Load() {
				t.Error("the first page was read before the keys' read started, not beside it")
			}
			pages.mu.Lock()
			most := int64(3)
			if tc.pageBytes > 0 {
				most = 1
			}
			if len(pages.limits) == 0 && tc.pods > 3 || slices.Max(append(pages.limits, 1)) > most {
				t.Errorf("pages after the first of %v objects, want %d at most", pages.limits, most)
			}
			pages.mu.Unlock()
			holdsEtcdsPods(t, restarted, c.cfg.Storage)
		})
	}
}

// cacherWithPods returns a cache, with a KeyReader if keyReader, over n
// pods created through it in two namespaces.
func cacherWithPods(t *testing.T, keyReader bool, n int) *testCacher {
	t.Helper()
	var opts []setupOption
	if keyReader {
		opts = append(opts, withKeyReader(testingclock.NewFakeClock(time.Now()), time.Hour))
	}
	c := newTestCacher(t, opts...)
	for i := range n {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%2), Name: fmt.Sprintf("p%02d", i)}}
		if err := c.Create(context.Background(), fmt.Sprintf("/pods/%s/%s", pod.Namespace, pod.Name), pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// holdsEtcdsPods checks that c holds exactly the pods etcd holds, read
// through store, in key order, at etcd's revision.
func holdsEtcdsPods(t *testing.T, c *Cacher, store storage.Interface) {
	t.Helper()
	ctx := context.Background()
	got, want := &example.PodList{}, &example.PodList{}
	if err := c.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, got); err != nil {
		t.Fatal(err)
	}
	if err := store.GetList(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: storage.Everything}, want); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != want.ResourceVersion || len(got.Items) != len(want.Items) {
		t.Fatalf("the cache holds %d pods at %s, etcd %d at %s", len(got.Items), got.ResourceVersion, len(want.Items), want.ResourceVersion)
	}
	for i := range want.Items {
		if g, w := got.Items[i], want.Items[i]; g.Namespace != w.Namespace || g.Name != w.Name || g.ResourceVersion != w.ResourceVersion {
			t.Errorf("pod %d: cache %s/%s@%s, etcd %s/%s@%s", i, g.Namespace, g.Name, g.ResourceVersion, w.Namespace, w.Name, w.ResourceVersion)
		}
	}
}

// failingPage fails the second page a cache's list reads after its first,
// once, with err, and counts the first pages: how often the whole list was
// read.
type failingPage struct {
	storage.Interface
	err        error
	firstPages atomic.Int64
	later      atomic.Int64
}

// wrap makes f fail a page of cfg's lists, through the store or as a range.
func (f *failingPage) wrap(cfg *Config) {
	f.Interface = cfg.Storage
	cfg.Storage = f
	cfg.wrapRanges = func(r source.RangeReader) source.RangeReader { return failingRanges{RangeReader: r, f: f} }
}

// fails tells whether the page being read fails.
func (f *failingPage) fails() bool { return f.later.Add(1) == 2 }

func (f *failingPage) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	if opts.Predicate.Continue == "" {
		f.firstPages.Add(1)
	} else if f.fails() {
		return f.err
	}
	return f.Interface.GetList(ctx, key, opts, listObj)
}

type failingRanges struct {
	source.RangeReader
	f *failingPage
}

func (r failingRanges) ReadRange(ctx context.Context, rev int64, from, to string, fn func(string, int64, func() (runtime.Object, error)) error) error {
	if r.f.fails() {
		return r.f.err
	}
	return r.RangeReader.ReadRange(ctx, rev, from, to, fn)
}

// TestListPageRetried restarts a cache over pods in pages of 3, with one
// page after the first failing once: a failure of etcd or of the way to it
// (a member restarting mid-stream) reads that page again at the list's
// revision, and keeps the others; a compacted revision, or an error not
// etcd's, which no read at the revision can get past, reads the whole list
// again at a new one. Either way the
// cache holds exactly etcd's state.
func TestListPageRetried(t *testing.T) {
	unavailable := grpcstatus.Error(grpccodes.Unavailable, "error reading from server: EOF")
	for _, tc := range []struct {
		name      string
		keyReader bool
		err       error
		// lists is how many times the whole list is read.
		lists   int64
		retried float64
	}{
		{name: "a range, etcd unavailable", keyReader: true, err: unavailable, lists: 1, retried: 1},
		{name: "a range, compacted", keyReader: true, err: apierrors.NewResourceExpired("compacted"), lists: 2},
		// Not etcd's, as a value the transformer cannot read with a key
		// that is gone: another read at the revision would meet it again.
		{name: "a range, not etcd's", keyReader: true, err: errors.New("reading a stored value: no such key"), lists: 2},
		{name: "pages one after another, etcd unavailable", err: unavailable, lists: 1, retried: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cacherWithPods(t, tc.keyReader, 10)
			retried := pageRetriesCounter.WithLabelValues("", "pods")
			before, _ := testutil.GetCounterMetricValue(retried)
			pages := &failingPage{err: tc.err}
			restarted := restartCache(t, c, func(cfg *Config) {
				pages.wrap(cfg)
				cfg.listPageSize = 3
				cfg.WarmStartRevisions = -1   // no backfill, which lists again
				cfg.Clock = clock.RealClock{} // the waits between reads
			})
			if n := pages.firstPages.Load(); n != tc.lists {
				t.Errorf("the whole list read %d times, want %d", n, tc.lists)
			}
			if n, _ := testutil.GetCounterMetricValue(retried); n-before != tc.retried {
				t.Errorf("%v pages read again, want %v", n-before, tc.retried)
			}
			holdsEtcdsPods(t, restarted, c.cfg.Storage)
		})
	}
}

// TestBackfillReadsWhatChanged restarts a cache warm over 30 pods of which
// two changed since the state the backfill lists: past its first page, the
// backfill reads from etcd only the range from one to the other, and of it
// decodes only those two, taking the others from the store. The history it fills still has the two as they were: a watch for
// the label the change added, from before it, sees each pod added.
func TestBackfillReadsWhatChanged(t *testing.T) {
	ctx := context.Background()
	c := newTestCacher(t, withKeyReader(testingclock.NewFakeClock(time.Now()), time.Hour))
	for i := range 30 {
		createPod(t, c, fmt.Sprintf("p%02d", i))
	}
	var changed []*example.Pod
	for _, name := range []string{"p10", "p13"} {
		updated := &example.Pod{}
		if err := c.GuaranteedUpdate(ctx, "/pods/ns/"+name, updated, false, nil,
			storage.SimpleUpdate(func(obj runtime.Object) (runtime.Object, error) {
				pod := obj.(*example.Pod)
				pod.Labels = map[string]string{"changed": "yes"}
				return pod, nil
			}), nil); err != nil {
			t.Fatal(err)
		}
		changed = append(changed, updated)
	}
	head, _ := c.cfg.Versioner.ParseResourceVersion(changed[1].ResourceVersion)
	from := int64(head) - 2 // every pod as created

	pages := &pageLimits{}
	restarted := restartCache(t, c, func(cfg *Config) {
		pages.wrap(cfg)
		cfg.listPageSize = 3
		cfg.WarmStartRevisions = 2
	})
	select {
	case <-restarted.src.Backfilled():
	case <-time.After(wait.ForeverTestTimeout):
		t.Fatal("the warm start's history fill never ended")
	}
	pages.mu.Lock()
	read, ranged := pages.readAt[from], pages.ranged[from]
	pages.mu.Unlock()
	if read != 2 || ranged != 4 {
		t.Errorf("the backfill read %d objects at revision %d past its first page and decoded %d, want p10 to p13 read and the 2 that changed since decoded", ranged, from, read)
	}

	pred := storage.SelectionPredicate{Label: labels.SelectorFromSet(labels.Set{"changed": "yes"}), Field: fields.Everything(), GetAttrs: podAttrs}
	w, err := restarted.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: strconv.FormatInt(from, 10), Recursive: true, Predicate: pred})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, want := range changed {
		ev := next(t, w)
		if got := objecttest.DecodedPod(t, ev.Object); ev.Type != watch.Added || got.Name != want.Name || got.ResourceVersion != want.ResourceVersion {
			t.Fatalf("got %s %s@%s, want ADDED %s@%s", ev.Type, got.Name, got.ResourceVersion, want.Name, want.ResourceVersion)
		}
	}
}
