package cacher

import (
	"context"
	"fmt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/kubernetes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	upstreamcacher "k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// The fan-out benchmarks compare our cacher with upstream's Cacher (used
// here only as the comparison) and raw etcd3, over the same etcd in
// one run. etcd runs in a child process (bench_etcd_test.go). Each reports,
// per implementation:
//
//	delivered/s     events delivered to watchers per second of the run
//	p50-ms p99-ms   latency from a write returning to a watcher receiving it
//	max-ms
//	closed          watchers closed before they received every event
//	cpu-us/event    process CPU (user+sys) per delivered event
//
// The writer and the consumers share the process with the cache, so CPU
// figures include them; they are the same for every implementation, so the
// ratios compare the caches. Run with -benchtime=1x; see docs/benchmarks.md.

type benchImpl struct {
	name string
	wrap func(b *testing.B, raw benchStore, prefix string, indexed bool) storage.Interface
}

// benchStore is an etcd3 store and the etcd client under it.
type benchStore struct {
	storage.Interface
	client *clientv3.Client
}

var benchImpls = []benchImpl{
	{name: "ours", wrap: func(b *testing.B, raw benchStore, prefix string, indexed bool) storage.Interface {
		cfg := Config{
			Storage: raw.Interface, GroupResource: schema.GroupResource{Resource: "pods"}, ResourcePrefix: prefix,
			KeyFunc: benchKeyFunc(prefix), NewFunc: newBenchPod, NewListFunc: newBenchPodList, GetAttrsFunc: podAttrs,
			Codec: examplev1Blob, Client: raw.client, StoragePrefix: etcd3testing.PathPrefix(),
		}
		if indexed {
			cfg.IndexerFuncs, cfg.Indexers = benchIndexes()
		}
		c, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Stop)
		waitReady(b, c)
		return c
	}},
	{name: "upstream", wrap: func(b *testing.B, raw benchStore, prefix string, indexed bool) storage.Interface {
		cfg := upstreamcacher.Config{
			Storage: raw.Interface, Versioner: storage.APIObjectVersioner{}, GroupResource: schema.GroupResource{Resource: "pods"},
			EventsHistoryWindow: upstreamcacher.DefaultEventFreshDuration, ResourcePrefix: prefix,
			KeyFunc: benchKeyFunc(prefix), GetAttrsFunc: podAttrs, NewFunc: newBenchPod, NewListFunc: newBenchPodList,
			Codec: examplev1Blob, Clock: clock.RealClock{},
		}
		if indexed {
			cfg.IndexerFuncs, cfg.Indexers = benchIndexes()
		}
		c, err := upstreamcacher.NewCacherFromConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		d := upstreamcacher.NewCacheDelegator(c, raw.Interface)
		b.Cleanup(func() { d.Stop(); c.Stop() })
		return d
	}},
	{name: "etcd3", wrap: func(_ *testing.B, raw benchStore, _ string, _ bool) storage.Interface { return raw.Interface }},
}

func newBenchPod() apiruntime.Object     { return &example.Pod{} }
func newBenchPodList() apiruntime.Object { return &example.PodList{} }

func benchKeyFunc(prefix string) func(apiruntime.Object) (string, error) {
	return func(obj apiruntime.Object) (string, error) { return storage.NamespaceKeyFunc(prefix, obj) }
}

func benchIndexes() (storage.IndexerFuncs, *cache.Indexers) {
	return storage.IndexerFuncs{"spec.nodeName": func(obj apiruntime.Object) string {
			return obj.(*example.Pod).Spec.NodeName
		}}, &cache.Indexers{"f:spec.nodeName": func(obj interface{}) ([]string, error) {
			return []string{obj.(*example.Pod).Spec.NodeName}, nil
		}}
}

// store returns a fresh etcd3 store under a new prefix.
func (e *benchEtcd) store(b *testing.B) (benchStore, string) {
	e.runs++
	return e.storeAt(b, fmt.Sprintf("/pods%d/", e.runs))
}

// storeAt returns an etcd3 store under prefix.
func (e *benchEtcd) storeAt(b *testing.B, prefix string) (benchStore, string) {
	raw, stop, err := newRawStore(e.client, prefix)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	return benchStore{Interface: raw, client: e.client.Client}, prefix
}

// newRawStore is an etcd3 store of example pods under prefix.
func newRawStore(client *kubernetes.Client, prefix string) (storage.Interface, func(), error) {
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	raw, err := etcd3.New(client, compactor, examplev1Blob, newBenchPod, newBenchPodList,
		etcd3testing.PathPrefix(), prefix, schema.GroupResource{Resource: "pods"}, identity.NewEncryptCheckTransformer(),
		etcd3.NewDefaultLeaseManagerConfig(), etcd3.NewDefaultDecoder(examplev1Blob, versioner), versioner)
	if err != nil {
		compactor.Stop()
		return nil, nil, err
	}
	return raw, func() { raw.Close(); compactor.Stop() }, nil
}

// benchPod is the i-th pod a fan-out run writes.
func benchPod(i, watchers int) *example.Pod {
	return &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%06d", i), Namespace: "ns", UID: benchUID(i)},
		Spec: example.PodSpec{NodeName: benchNode(i, watchers)}}
}

// benchUID is the i-th pod's UID: random-looking, as real UIDs are, so
// that their shard hashes spread over the hash space, and the same in the
// etcd child that writes the pod and the benchmark that expects it.
func benchUID(i int) types.UID {
	r := rand.New(rand.NewPCG(uint64(i), 5866))
	return types.UID(fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", r.Uint32(), r.Uint32N(1<<16), r.Uint32N(1<<12),
		r.Uint32N(1<<12), r.Uint64N(1<<48)))
}

// benchNode spreads writes over one node per watcher.
func benchNode(i, watchers int) string { return "node-" + strconv.Itoa(i%watchers) }

// fanOut is one scenario.
type fanOut struct {
	watchers int
	writes   int
	// rate is writes per second; 0 writes as fast as etcd takes them.
	rate float64
	// slow is the fraction of watchers that spend slowDelay per event.
	slow      float64
	slowDelay time.Duration
	// selective gives each watcher its own spec.nodeName selector and
	// spreads writes over those nodes.
	selective bool
}

type fanOutResult struct {
	delivered, expected int64
	closed              int64
	elapsed             time.Duration
	cpu                 time.Duration
	latencies           []time.Duration // fast watchers only
}

func (r fanOutResult) report(b *testing.B, writes int) {
	b.ReportMetric(float64(r.delivered)/r.elapsed.Seconds(), "delivered/s")
	b.ReportMetric(float64(r.closed), "closed")
	b.ReportMetric(float64(r.delivered)/float64(r.expected)*100, "%delivered")
	if r.delivered > 0 {
		b.ReportMetric(float64(r.cpu.Microseconds())/float64(r.delivered), "cpu-us/event")
	}
	b.ReportMetric(float64(r.cpu.Microseconds())/float64(writes), "cpu-us/write")
	if len(r.latencies) > 0 {
		slices.Sort(r.latencies)
		pct := func(p float64) float64 {
			return float64(r.latencies[int(p*float64(len(r.latencies)-1))].Microseconds()) / 1000
		}
		b.ReportMetric(pct(0.5), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
		b.ReportMetric(pct(1), "max-ms")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (f fanOut) run(b *testing.B, e *benchEtcd, s storage.Interface, prefix string) fanOutResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rv, err := s.GetCurrentResourceVersion(ctx)
	if err != nil {
		b.Fatal(err)
	}
	writeDone := make([]atomic.Int64, f.writes)
	type consumer struct {
		slow     bool
		received []int64 // receive time per write index; 0 if not received
	}
	consumers := make([]*consumer, f.watchers)
	var res fanOutResult
	cs := newConsumers()
	for i := range consumers {
		pred := storage.Everything
		expected := f.writes
		if f.selective {
			pred = storage.SelectionPredicate{Label: labels.Everything(),
				Field: fields.OneTermEqualSelector("spec.nodeName", benchNode(i, f.watchers)), GetAttrs: podAttrs}
			expected = f.writes / f.watchers
			if i < f.writes%f.watchers {
				expected++
			}
		}
		res.expected += int64(expected)
		w, err := s.Watch(ctx, prefix, storage.ListOptions{ResourceVersion: strconv.FormatUint(rv, 10), Recursive: true, Predicate: pred})
		if err != nil {
			b.Fatal(err)
		}
		c := &consumer{slow: float64(i) < f.slow*float64(f.watchers), received: make([]int64, f.writes)}
		consumers[i] = c
		cs.consume(b, w, expected, func(ev watch.Event) {
			now := time.Now().UnixNano()
			name := objecttest.ObjectName(ev.Object)
			idx, _ := strconv.Atoi(strings.TrimPrefix(name, "p-"))
			c.received[idx] = now
			if c.slow {
				time.Sleep(f.slowDelay) // the workload: a consumer that takes this long per event
			}
		})
	}

	// The writer is the etcd child process: its CPU is not the cache's.
	cpuStart, start := processCPU(), time.Now()
	if err := e.write(benchWrite{prefix: prefix, writes: f.writes, watchers: f.watchers, rate: f.rate},
		func(i int, at int64) { writeDone[i].Store(at) }); err != nil {
		b.Fatal(err)
	}
	cs.finish(2 * time.Minute)
	res.elapsed, res.cpu = time.Since(start), processCPU()-cpuStart
	res.closed = cs.closed.Load()
	for _, c := range consumers {
		for i, at := range c.received {
			if at == 0 {
				continue
			}
			res.delivered++
			if !c.slow {
				res.latencies = append(res.latencies, max(0, time.Duration(at-writeDone[i].Load())))
			}
		}
	}
	return res
}

func runScenario(b *testing.B, f fanOut, impls []benchImpl) {
	e := newBenchEtcd(b)
	for _, impl := range impls {
		b.Run(impl.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				raw, prefix := e.store(b)
				s := impl.wrap(b, raw, prefix, f.selective)
				res := f.run(b, e, s, prefix)
				res.report(b, f.writes)
				if f.rate > 0 && f.slow == 0 && !f.selective {
					recordChart(impl.name, f.watchers, res)
				}
			}
		})
	}
}

// BenchmarkFanOut: N watchers on everything, writes as fast as possible.
func BenchmarkFanOut(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			runScenario(b, fanOut{watchers: n, writes: 200}, benchImpls)
		})
	}
}

// BenchmarkFanOutFixedRate: N watchers, writes at 100/s, so both caches
// deliver everything and CPU and latency are what differ. The middle
// counts give the chart its shape.
func BenchmarkFanOutFixedRate(b *testing.B) {
	for _, n := range []int{1000, 2500, 5000, 10000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			runScenario(b, fanOut{watchers: n, writes: 200, rate: 100}, benchImpls[:2])
		})
	}
}

// BenchmarkSlowWatchers: 1,000 watchers, 10% of them spending 20 ms per
// event, writes at 100/s. Reports the fast watchers' latency and closures.
func BenchmarkSlowWatchers(b *testing.B) {
	for _, slow := range []float64{0, 0.1} {
		b.Run(fmt.Sprintf("slow=%v", slow), func(b *testing.B) {
			runScenario(b, fanOut{watchers: 1000, writes: 500, rate: 100, slow: slow, slowDelay: 20 * time.Millisecond}, benchImpls[:2])
		})
	}
}

// BenchmarkSelectiveWatchers: each watcher selects its own spec.nodeName;
// CPU per write should not grow with watchers that do not match.
func BenchmarkSelectiveWatchers(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			runScenario(b, fanOut{watchers: n, writes: 1000, selective: true}, benchImpls[:2])
		})
	}
}

// BenchmarkIdleWatcherMemory opens N idle watchers and reports heap plus
// stack per watcher.
func BenchmarkIdleWatcherMemory(b *testing.B) {
	const n = 10000
	e := newBenchEtcd(b)
	for _, impl := range benchImpls[:2] {
		b.Run(impl.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				raw, prefix := e.store(b)
				s := impl.wrap(b, raw, prefix, false)
				rv, err := s.GetCurrentResourceVersion(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				before := inUse()
				ws := make([]watch.Interface, n)
				for j := range ws {
					if ws[j], err = s.Watch(context.Background(), prefix, storage.ListOptions{
						ResourceVersion: strconv.FormatUint(rv, 10), Recursive: true, Predicate: storage.Everything}); err != nil {
						b.Fatal(err)
					}
				}
				after := inUse()
				b.ReportMetric(float64(after-before)/n, "B/idle-watcher")
				for _, w := range ws {
					w.Stop()
				}
			}
		})
	}
}

func inUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}

// BenchmarkUpstreamStore runs upstream's storage benchmarks against both
// caches: write throughput under background load, and list.
func BenchmarkUpstreamStore(b *testing.B) {
	// Upstream's functions use keys under /pods/, so each run gets its own etcd.
	data := storagetesting.PrepareBenchmarkData(10, 100, 50)
	for _, impl := range benchImpls[:2] {
		b.Run("impl="+impl.name, func(b *testing.B) {
			b.Run("WriteThroughput", func(b *testing.B) {
				raw, prefix := newBenchEtcd(b).storeAt(b, "/pods/")
				s := impl.wrap(b, raw, prefix, true)
				storagetesting.RunBenchmarkWriteThroughput(context.Background(), b, s, data, true, nil)
			})
			b.Run("List", func(b *testing.B) {
				raw, prefix := newBenchEtcd(b).storeAt(b, "/pods/")
				s := impl.wrap(b, raw, prefix, true)
				if err := storagetesting.PrecreateBenchmarkPods(context.Background(), s, data); err != nil {
					b.Fatal(err)
				}
				for _, useIndex := range []bool{false, true} {
					b.Run(fmt.Sprintf("Indexed=%v", useIndex), func(b *testing.B) {
						storagetesting.RunBenchmarkStoreList(context.Background(), b, s, data, useIndex)
					})
				}
			})
		})
	}
}
