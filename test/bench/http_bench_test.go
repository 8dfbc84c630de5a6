// Package bench compares our server with the same server over upstream's
// Cacher through real HTTP watch streams. etcd, the server and this load
// client run as separate processes, so the server's CPU and memory are its own.
package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// TestMain removes the binaries build made: about 275 MB a run. In a
// writer process it writes instead (writer_process_test.go).
func TestMain(m *testing.M) {
	runWriterProcess()
	code := m.Run()
	testkit.RemoveBuilds()
	os.Exit(code)
}

// build compiles etcd, our server and the upstream-wired server once, and
// returns their directory.
func build(b *testing.B) string {
	return filepath.Dir(testkit.Build(b, testkit.Etcd, testkit.Ours, testkit.Upstream)[0])
}

// start runs bin until the benchmark ends, then stops it as SIGTERM does.
func start(b *testing.B, bin string, args ...string) *testkit.Process {
	return testkit.StartProcess(b, testkit.ProcessConfig{Bin: bin, Args: args, Grace: 30 * time.Second})
}

// startEtcd starts a one-member etcd under dir with extra flags, and
// returns its client URL.
func startEtcd(b *testing.B, dir string, extra ...string) string {
	return startEtcdCluster(b, dir, extra...).Endpoints()[0]
}

// startEtcdCluster is startEtcd, returning the member's process too.
func startEtcdCluster(b *testing.B, dir string, extra ...string) *testkit.EtcdCluster {
	return testkit.StartEtcd(b, testkit.EtcdConfig{Bin: filepath.Join(build(b), "etcd"), Dir: filepath.Join(dir, "etcd"), Members: 1, Extra: extra})
}

// procStats reads a process's CPU time and resident memory from /proc.
func procStats(b *testing.B, pid int) (cpu time.Duration, rss int64) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const ticksPerSecond = 100 // USER_HZ on Linux
	cpu = time.Duration(utime+stime) * time.Second / ticksPerSecond
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			rss = kb * 1024
		}
	}
	return cpu, rss
}

type scenario struct {
	streams, writes int
	rate            float64
	// perConnection is how many watch streams share one HTTP/2
	// connection: 500 as in the scale issue's reference runs, or 1 as for
	// agents that each run in their own process, like kubelets.
	perConnection int
}

func BenchmarkHTTPWatch(b *testing.B) {
	for _, sc := range []scenario{
		{streams: 1000, writes: 200, rate: 100, perConnection: 500},
		{streams: 1000, writes: 200, rate: 100, perConnection: 1},
		{streams: 5000, writes: 200, rate: 100, perConnection: 500},
	} {
		for _, impl := range []string{"ours", "upstream"} {
			b.Run(fmt.Sprintf("streams=%d/perConn=%d/rate=%v/impl=%s", sc.streams, sc.perConnection, sc.rate, impl), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					runHTTP(b, impl, sc)
				}
			})
		}
	}
}

// startWithEtcd starts an etcd of its own and the server bin over it,
// without max-in-flight limits, with args added, and waits until it serves.
func startWithEtcd(ctx context.Context, b *testing.B, bin string, args ...string) (server *testkit.Process, cfg *rest.Config, etcdURL string) {
	dir := b.TempDir()
	etcdURL = startEtcd(b, dir)
	server = start(b, bin, append([]string{"--data-dir", filepath.Join(dir, "server"),
		"--secure-port", strconv.Itoa(testkit.FreePort(b)), "--etcd-servers", etcdURL,
		"--max-requests-inflight", "0", "--max-mutating-requests-inflight", "0"}, args...)...)
	return server, waitServing(ctx, b, filepath.Join(dir, "server", "kubeconfig")), etcdURL
}

func runHTTP(b *testing.B, impl string, sc scenario) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	server, cfg, _ := startWithEtcd(ctx, b, filepath.Join(build(b), impl))
	client := versioned.NewForConfigOrDie(cfg)
	list, err := client.FleetV1beta1().Assignments("bench").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	_, rssBefore := procStats(b, server.Pid())

	perConnection := sc.perConnection
	var clients []versioned.Interface
	for i := 0; i < (sc.streams+perConnection-1)/perConnection; i++ {
		clients = append(clients, versioned.NewForConfigOrDie(ownConnection(cfg)))
	}
	writeDone := make([]atomic.Int64, sc.writes)
	var delivered, closed atomic.Int64
	latencies := make([][]time.Duration, sc.streams)
	var wg sync.WaitGroup
	for i := 0; i < sc.streams; i++ {
		w, err := clients[i/perConnection].FleetV1beta1().Assignments("bench").Watch(ctx,
			metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func(i int, w watch.Interface) {
			defer wg.Done()
			defer w.Stop()
			got := 0
			for got < sc.writes {
				ev, ok := <-w.ResultChan()
				if !ok || ev.Type == watch.Error {
					closed.Add(1)
					return
				}
				if ev.Type != watch.Added {
					continue
				}
				at := time.Now().UnixNano()
				idx, _ := strconv.Atoi(strings.TrimPrefix(ev.Object.(*v1beta1.Assignment).Name, "w-"))
				if done := writeDone[idx].Load(); done > 0 {
					latencies[i] = append(latencies[i], time.Duration(max(0, at-done)))
				}
				got++
				delivered.Add(1)
			}
		}(i, w)
	}
	cpuStart, rssWatching := procStats(b, server.Pid())
	if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
		go profile(ctx, cfg, "profile", filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", impl, sc.streams)))
	}
	start := time.Now()
	interval := time.Duration(float64(time.Second) / sc.rate)
	for i := 0; i < sc.writes; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d) // pacing the fixed write rate
		}
		a := &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w-%04d", i), Namespace: "bench"},
			Spec: v1beta1.AssignmentSpec{AgentName: "agent-" + strconv.Itoa(i%50)}}
		if _, err := client.FleetV1beta1().Assignments("bench").Create(ctx, a, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		writeDone[i].Store(time.Now().UnixNano())
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		cancel() // bounded: what has not arrived by now counts as not delivered
		<-done
	}
	elapsed := time.Since(start)
	cpuEnd, _ := procStats(b, server.Pid())

	var all []time.Duration
	for _, l := range latencies {
		all = append(all, l...)
	}
	b.ReportMetric(float64(delivered.Load())/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(delivered.Load())/float64(sc.streams*sc.writes)*100, "%delivered")
	b.ReportMetric(float64(closed.Load()), "closed")
	if d := delivered.Load(); d > 0 {
		b.ReportMetric(float64((cpuEnd-cpuStart).Microseconds())/float64(d), "server-cpu-us/event")
	}
	b.ReportMetric(float64(rssWatching-rssBefore)/float64(sc.streams)/1024, "server-KiB/watch")
	if len(all) > 0 {
		p99 := percentile(all, 0.99)
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	}
}

// profile saves a profile of the server taken while the writes run, of
// kind "profile" (CPU) or "allocs" for BENCH_PROFILE_DIR, or a runtime
// trace (kind "trace") for BENCH_TRACE_DIR, of BENCH_PROFILE_SECONDS (2).
// It is for finding causes, not for figures, which it changes a little.
func profile(ctx context.Context, cfg *rest.Config, kind, path string) {
	rc, err := rest.UnversionedRESTClientFor(&rest.Config{Host: cfg.Host, TLSClientConfig: cfg.TLSClientConfig,
		ContentConfig: rest.ContentConfig{NegotiatedSerializer: scheme.Codecs.WithoutConversion()}})
	if err != nil {
		return
	}
	seconds := testkit.EnvInt("BENCH_PROFILE_SECONDS", 2)
	if kind == "allocs" {
		// A memory profile holds what was allocated up to a collection
		// or two ago, and collections are rare: the delta profile of
		// ?seconds= can be empty, or hold what came long before. Two
		// profiles, each after two collections, bound the window: go
		// tool pprof -base path-start path.
		allocs := func() ([]byte, error) {
			if _, err := rc.Get().AbsPath("/debug/pprof/heap").Param("gc", "1").DoRaw(ctx); err != nil {
				return nil, err
			}
			return rc.Get().AbsPath("/debug/pprof/allocs").Param("gc", "1").DoRaw(ctx)
		}
		start, err := allocs()
		if err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(seconds) * time.Second):
		}
		end, err := allocs()
		if err == nil {
			_ = os.WriteFile(path+"-start", start, 0o600)
			_ = os.WriteFile(path, end, 0o600)
		}
		return
	}
	data, err := rc.Get().AbsPath("/debug/pprof/"+kind).Param("seconds", strconv.Itoa(seconds)).DoRaw(ctx)
	if err == nil {
		_ = os.WriteFile(path, data, 0o600)
	}
}

// serverBinary is a server the benchmarks compare: ours, upstream's, or
// another binary for an A/B.
type serverBinary struct{ name, bin string }

// serverBinaries returns the servers named in the environment variable
// impls (default ours,upstream), built by build, and the binaries listed in
// alts, named alt=<file name>.
func serverBinaries(b *testing.B, impls, alts string) []serverBinary {
	bins := build(b)
	var out []serverBinary
	for _, name := range strings.Split(cmp.Or(os.Getenv(impls), "ours,upstream"), ",") {
		out = append(out, serverBinary{name, filepath.Join(bins, name)})
	}
	if alts := os.Getenv(alts); alts != "" {
		for _, alt := range strings.Split(alts, ",") {
			out = append(out, serverBinary{"alt=" + filepath.Base(alt), alt})
		}
	}
	return out
}

// getStream starts a GET of JSON at url and returns its response, failing
// the benchmark with the server's answer unless it is 200.
func getStream(ctx context.Context, b *testing.B, hc *http.Client, url string) *http.Response {
	return getStreamAs(ctx, b, hc, url, "application/json")
}

// getStreamAs is getStream in the media type accept asks for.
func getStreamAs(ctx context.Context, b *testing.B, hc *http.Client, url, accept string) *http.Response {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", accept)
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		b.Fatalf("GET %s: %d %.300s", url, resp.StatusCode, body)
	}
	return resp
}

// waitServing waits until the server behind kubeconfig, which it writes
// once it runs, answers a list, and returns an unthrottled config for it.
func waitServing(ctx context.Context, b *testing.B, kubeconfig string) *rest.Config {
	var cfg *rest.Config
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return false, nil
		}
		c.QPS, c.Burst = -1, -1
		if _, err := versioned.NewForConfigOrDie(c).FleetV1beta1().Assignments("bench").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return false, nil
		}
		cfg = c
		return true, nil
	}); err != nil {
		b.Fatalf("server never served: %v", err)
	}
	return cfg
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}
