package cacher

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	upstream "k8s.io/apiserver/pkg/storage/cacher/metrics"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
)

func metricsConsistencyChecks(status string) compbasemetrics.CounterMetric {
	return upstream.StorageConsistencyCheckTotal.WithLabelValues("", "pods", status)
}

// withKeyReader gives the cache a KeyReader over the test etcd, with the
// periodic check every interval of clk.
func withKeyReader(clk *testingclock.FakeClock, interval time.Duration) setupOption {
	return func(o *setupOptions) {
		o.config = func(cfg *Config) {
			cfg.Clock = clk
			cfg.ConsistencyCheckInterval = interval
		}
		o.keyReader = true
	}
}

// dropFromStateForTest removes key from the cache's current state behind
// the dispatcher's back, as a lost event would: the cache then differs from
// etcd and only the consistency check can tell. The state keeps its
// resourceVersion, and the history does not hear of it. The test writes
// nothing meanwhile, so no event is applied beside it.
func (c *Cacher) dropFromStateForTest(t *testing.T, key string) {
	o, ok := c.store.Get(key)
	if !ok {
		t.Fatalf("the cache does not hold %s", key)
	}
	c.store.Apply(&fanout.Event{Type: watch.Deleted, Key: key, Rev: c.store.Latest().RV, Cur: o, Prev: o})
}

// putInStateForTest puts obj into the cache's current state under key,
// behind the dispatcher's back, as a phantom or stale event would.
func (c *Cacher) putInStateForTest(t *testing.T, key string, rv uint64) {
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: key[strings.LastIndex(key, "/")+1:], Namespace: "ns", ResourceVersion: fmt.Sprint(rv)}}
	o := objecttest.PodObject(pod)
	o.Key = key
	prev, _ := c.store.Get(key)
	c.store.Apply(&fanout.Event{Type: watch.Modified, Key: key, Rev: c.store.Latest().RV, Cur: o, Prev: prev})
}

// TestConsistencyCheck corrupts the cache and checks that the periodic
// check notices, counts a failure, and repairs the cache by re-listing,
// ending watchers with 410, after which the check passes again.
func TestConsistencyCheck(t *testing.T) {
	ctx := context.Background()
	clk := testingclock.NewFakeClock(time.Now())
	const interval = time.Minute
	c := newTestCacher(t, withKeyReader(clk, interval))
	waitReady(t, c.Cacher)
	metric := func(status string) float64 {
		v, _ := testutil.GetCounterMetricValue(metricsConsistencyChecks(status))
		return v
	}
	successes, failures := metric(source.CheckSuccess), metric(source.CheckFailure)

	var last *example.Pod
	for _, name := range []string{"a", "b", "c"} {
		last = createPod(t, c, name)
	}
	rv, _ := c.cfg.Versioner.ParseResourceVersion(last.ResourceVersion)
	if err := c.d.WaitFor(ctx, rv, wait.ForeverTestTimeout, c.requestProgress); err != nil {
		t.Fatal(err)
	}
	if r := c.src.Check(ctx); r.Status != source.CheckSuccess {
		t.Fatalf("check of an intact cache: %s, %s, %v", r.Status, r.Diff, r.Err)
	}
	if got := metric(source.CheckSuccess); got != successes+1 {
		t.Errorf("checks{status=success} = %v, want %v", got, successes+1)
	}

	w, err := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: last.ResourceVersion, Recursive: true, Predicate: storage.Everything})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	c.dropFromStateForTest(t, "/pods/ns/b")

	// The periodic check runs after 1 to 1.5 intervals.
	testkit.StepUntil(t, clk, func() bool { return metric(source.CheckFailure) > failures })
	ev := next(t, w)
	if ev.Type != watch.Error || ev.Object.(*metav1.Status).Code != 410 {
		t.Fatalf("watcher after the repair: got %v, want 410", ev)
	}
	testkit.StepUntil(t, clk, func() bool { return c.ReadinessCheck() == nil })
	got := &example.Pod{}
	if err := c.Get(ctx, "/pods/ns/b", storage.GetOptions{ResourceVersion: "0"}, got); err != nil {
		t.Fatalf("the repaired cache lacks the dropped pod: %v", err)
	}
	if r := c.src.Check(ctx); r.Status != source.CheckSuccess {
		t.Fatalf("check after the repair: %s, %s, %v", r.Status, r.Diff, r.Err)
	}
}

// TestConsistencyCheckReadsKeysOnly compares what etcd sends for one check
// with what it sends for a full list, at 1,000 objects of 1 KiB; the
// benchmark below reports 10,000. The check must cost etcd at least 10×
// less.
func TestConsistencyCheckReadsKeysOnly(t *testing.T) {
	c := newTestCacher(t, withKeyReader(testingclock.NewFakeClock(time.Now()), time.Hour))
	waitReady(t, c.Cacher)
	check, list := checkAndListBytes(t, c, 1000)
	t.Logf("1,000 objects of 1 KiB: check %d bytes, full list %d bytes (%.1fx)", check, list, float64(list)/float64(check))
	if check*10 > list {
		t.Errorf("a check reads %d bytes from etcd, more than a tenth of a list's %d", check, list)
	}
}

// BenchmarkConsistencyCheck reports the bytes etcd sends for one check and
// for one full list at 10,000 objects of 1 KiB.
func BenchmarkConsistencyCheck(b *testing.B) {
	c := newTestCacher(b, withKeyReader(testingclock.NewFakeClock(time.Now()), time.Hour))
	waitReady(b, c.Cacher)
	check, list := checkAndListBytes(b, c, 10000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r := c.src.Check(context.Background()); r.Status != source.CheckSuccess {
			b.Fatal(r.Status, r.Diff, r.Err)
		}
	}
	b.ReportMetric(float64(check), "check-bytes")
	b.ReportMetric(float64(list), "list-bytes")
	b.ReportMetric(float64(list)/float64(check), "list/check")
}

// checkAndListBytes writes n pods with a 1 KiB annotation straight to etcd,
// waits for the cache to hold them, runs a check and reads a full list the
// way the etcd3 store pages one.
func checkAndListBytes(tb testing.TB, c *testCacher, n int) (check, list int64) {
	tb.Helper()
	ctx := context.Background()
	payload := strings.Repeat("x", 1024)
	// One write per revision, as the API server makes them; a few at a time.
	var g errgroup.Group
	g.SetLimit(8)
	for i := 0; i < n; i++ {
		g.Go(func() error {
			pod := &examplev1.Pod{
				TypeMeta:   metav1.TypeMeta{APIVersion: "example.apiserver.k8s.io/v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%05d", i), Namespace: "ns", Annotations: map[string]string{"payload": payload}},
			}
			data, err := runtime.Encode(examplev1Blob, pod)
			if err != nil {
				return err
			}
			_, err = c.client.Put(ctx, fmt.Sprintf("%s/pods/ns/%s", etcd3testing.PathPrefix(), pod.Name), string(data))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
	rev, err := c.GetCurrentResourceVersion(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.d.WaitFor(ctx, rev, wait.ForeverTestTimeout, c.requestProgress); err != nil {
		tb.Fatal(err)
	}
	r := c.src.Check(ctx)
	if r.Status != source.CheckSuccess {
		tb.Fatalf("check: %s %s %v", r.Status, r.Diff, r.Err)
	}
	prefix := etcd3testing.PathPrefix() + "/pods/"
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	for {
		resp, err := c.client.Get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(int64(r.RV)), clientv3.WithLimit(source.ListPageSize))
		if err != nil {
			tb.Fatal(err)
		}
		list += int64(proto.Size((*pb.RangeResponse)(resp)))
		if !resp.More {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return r.Bytes, list
}
