package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// BenchmarkServe measures what a watch stream costs the serving path: K
// single-object streams (fieldSelector=metadata.name=…, bookmarks on), as
// kubelets watch their Secrets and agents their Assignments, SERVE_PER_CONN
// to an HTTP/2 connection, K/SERVE_WRITES of them on each name, so that
// the writes deliver one event to every stream, as in issue 57's
// measurement; against our server and the same server over upstream's
// Cacher (test/bench/cmd/server-upstream), each on an etcd of its own,
// taking turns for SERVE_ROUNDS rounds. Upstream's wiring shares our
// server's handler chain, so the serving path's changes of issue 57 run in
// ours only (Options.WatchesOffChainStack): the baseline keeps the generic
// server's defaults.
//
// Reported, per server:
//
//	KiB/stream, heap-KiB/stream   RSS, and the live heap after a collection, the
//	                              streams add, per stream
//	written-KiB/stream            RSS per stream once each has carried an event
//	written-heap-KiB/stream       the same for the live heap
//	stack-KiB/stream              goroutine stacks per stream, before and after the
//	written-stack-KiB/stream      event (the whole server's, divided)
//	goroutines/stream             what the streams add
//	open-cpu-s                    server CPU from the first stream's request until the
//	                              last one's response began
//	writes-cpu-s, cpu-us/event    server CPU during the writes (creates included), and
//	                              per event delivered
//	creates-cpu-s                 server CPU of the same creates, at the same rate, on a
//	                              server of their own with no stream open: what the
//	                              writes cost without a delivery
//	delivery-us/event             (writes-cpu-s - creates-cpu-s) per event delivered:
//	                              what the serving path costs an event
//	p50-ms p99-ms max-ms          from a write's commit, as this process's own etcd
//	                              watch sees it, to the stream's client reading it
//	idle-cores                    server CPU per second over SERVE_IDLE_SECONDS (180)
//	                              once the opening settled: bookmarks and nothing else
//	churn-cores, cpu-us/reopen    server CPU per second while streams end and are opened
//	                              again at SERVE_CHURN_RATE a second for SERVE_CHURN_SECONDS
//	                              (60), and per re-opened stream above idle-cores
//	settle-s                      how long the CPU took to stay under 0.05 cores for 5 s
//	                              after the opening (at most 120)
//	%delivered closed             events the streams got of those they should, and
//	                              streams that ended
//
// SERVE_STREAMS (20,000), SERVE_PER_CONN (100), SERVE_WRITES (2,000) at
// SERVE_RATE (100/s) change the scale; SERVE_IMPLS and SERVE_ALT pick servers
// as AGENTS_IMPLS and AGENTS_ALT do. BENCH_PROFILE_DIR saves each server's
// heap profile once the streams are open and once they carried an event, and
// its CPU profiles of the writes and of the churn.
func BenchmarkServe(b *testing.B) {
	sc := serveScenario{Streams: testkit.StreamsFromEnv(testkit.Streams{Count: 20_000, PerConn: defaultStreamsPerConn, Writes: 2_000, Rate: 100, Idle: 3 * time.Minute}),
		churn: time.Duration(testkit.EnvInt("SERVE_CHURN_SECONDS", 60)) * time.Second}
	// client-go ends a watch after 5 to 10 minutes (the reflector's
	// timeoutSeconds) and opens another: K/450 a second on average.
	sc.churnRate = float64(testkit.EnvInt("SERVE_CHURN_RATE", max(1, sc.Count/450)))
	impls := serverBinaries(b, "SERVE_IMPLS", "SERVE_ALT")
	for range testkit.EnvInt("SERVE_ROUNDS", 3) {
		for _, impl := range impls {
			b.Run("impl="+impl.name, func(b *testing.B) {
				for range b.N {
					runServe(b, impl.name, impl.bin, sc)
				}
			})
		}
	}
}

type serveScenario struct {
	testkit.Streams
	churnRate float64
	churn     time.Duration
}

// profileCPU saves, under BENCH_PROFILE_DIR, the server's CPU profile of
// the next secs seconds as name; what it returns is closed once it is
// saved, or failed, or at once without BENCH_PROFILE_DIR. A failed profile
// does not fail the run.
func profileCPU(ctx context.Context, b *testing.B, hc *http.Client, host string, secs int, name string) <-chan struct{} {
	done := make(chan struct{})
	dir := os.Getenv("BENCH_PROFILE_DIR")
	if dir == "" {
		close(done)
		return done
	}
	go func() { // not get, which calls b.Fatal, off the benchmark's goroutine
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, host+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), nil)
		resp, err := hc.Do(req)
		if err != nil {
			b.Logf("CPU profile: %v", err)
			return
		}
		defer resp.Body.Close()
		if data, err := io.ReadAll(resp.Body); err == nil && resp.StatusCode == http.StatusOK {
			_ = os.WriteFile(filepath.Join(dir, name), data, 0o600)
		}
	}()
	return done
}

// defaultStreamsPerConn is the generic server's limit of streams on an
// HTTP/2 connection when --http2-max-streams-per-connection is unset: what
// a replica behind the kube-aggregator gets, whose client opens another
// connection when one is full. Issue 57's own measurement put 500 on a
// connection (SERVE_PER_CONN=500); there x/net's write scheduler, which
// walks every stream of the connection for each frame, took a fifth of
// both servers' CPU during the writes.
const defaultStreamsPerConn = 100

// createsAlone returns the server CPU of sc's creates, at sc's rate, on a
// server and etcd of their own with no stream open: what the writes cost
// without a delivery. Not on the server the streams use: upstream's watch
// cache grows with a burst of writes, and sizes each watcher's channels
// from it (30 KiB more heap a single-object watch after 40,000 creates in
// 100 s), which would count in its streams' memory.
func createsAlone(b *testing.B, bin string, sc serveScenario, args []string) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	server, cfg, _ := startWithEtcd(ctx, b, bin, args...)
	cpu, _ := procStats(b, server.Pid())
	createPaced(ctx, b, versioned.NewForConfigOrDie(cfg), "serve", sc.Writes, sc.Rate)
	end, _ := procStats(b, server.Pid())
	if err := server.Terminate(30 * time.Second); err != nil {
		b.Fatal(err)
	}
	return end - cpu
}

func runServe(b *testing.B, impl, bin string, sc serveScenario) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := []string{"--max-watches", "0"}
	if sc.PerConn > defaultStreamsPerConn { // else the generic server's default, as users get it
		args = append(args, "--http2-max-streams-per-connection", strconv.Itoa(sc.PerConn))
	}
	creates := createsAlone(b, bin, sc, args)
	server, cfg, etcdURL := startWithEtcd(ctx, b, bin, args...)
	pid := server.Pid()
	commits := newCommitClock(ctx, b, etcdURL)
	const ns = "serve"
	client := versioned.NewForConfigOrDie(cfg)
	list, err := client.FleetV1beta1().Assignments(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(ownConnection(cfg))
	if err != nil {
		b.Fatal(err)
	}
	_, rssBefore := serverMemory(ctx, b, hc, cfg.Host, pid) // after two collections
	heapBefore := liveHeap(ctx, b, hc, cfg.Host)
	goroutinesBefore := scrapeValue(string(get(ctx, b, hc, cfg.Host+"/metrics")), "go_goroutines")

	// Open the streams, SERVE_PER_CONN a connection.
	base := cfg.Host + "/apis/fleet.example.com/v1beta1/namespaces/" + ns + "/assignments"
	var mu sync.Mutex // guards reads
	type read struct {
		name string
		at   time.Time
	}
	var reads []read
	var delivered, closed, bookmarks atomic.Int64
	allDone := make(chan struct{})
	var doneOnce sync.Once
	onEvent := func(name string, at time.Time) {
		mu.Lock()
		reads = append(reads, read{name, at})
		mu.Unlock()
		if delivered.Add(1) == int64(sc.Count) {
			doneOnce.Do(func() { close(allDone) })
		}
	}
	cpuOpen, _ := procStats(b, pid)
	conns := make([]*http.Client, 0, sc.Count/sc.PerConn+1)
	stops := make([]context.CancelFunc, sc.Count) // each stream's own, for the churn
	ended := make([]<-chan struct{}, sc.Count)    // closed once each stream's reader returned
	open := func(i int, rv string) {
		if i%sc.PerConn == 0 && len(conns) == i/sc.PerConn {
			conn, err := rest.HTTPClientFor(ownConnection(cfg))
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, conn)
		}
		q := url.Values{"watch": {"1"}, "allowWatchBookmarks": {"true"}, "resourceVersion": {rv},
			"fieldSelector": {"metadata.name=" + agentName(i%sc.Writes)}}
		var streamCtx context.Context
		streamCtx, stops[i] = context.WithCancel(ctx)
		ended[i] = openWatch(streamCtx, b, conns[i/sc.PerConn], base+"?"+q.Encode(), onEvent, func() { bookmarks.Add(1) }, func() { closed.Add(1) })
	}
	for i := range sc.Count {
		open(i, list.ResourceVersion)
	}
	cpuOpened, _ := procStats(b, pid)
	settled, err := testkit.Settle(ctx, server)
	if err != nil {
		b.Fatal(err)
	}
	_, rssOpen := serverMemory(ctx, b, hc, cfg.Host, pid)
	heapOpen := liveHeap(ctx, b, hc, cfg.Host)
	stackOpen := stackInUse(ctx, b, hc, cfg.Host)
	goroutinesOpen := scrapeValue(string(get(ctx, b, hc, cfg.Host+"/metrics")), "go_goroutines")
	saveHeapProfile(ctx, b, hc, cfg.Host, "BENCH_PROFILE_DIR", fmt.Sprintf("serve-%s-%d-heap.pprof", filepath.Base(bin), pid))
	idle := idleCores(b, pid, sc.Idle)

	// Writes: each create reaches the streams of its name, streams/writes of
	// them, and every stream gets one event.
	profiled := profileCPU(ctx, b, hc, cfg.Host, max(1, int(float64(sc.Writes)/sc.Rate)), fmt.Sprintf("serve-%s-%d-cpu.pprof", filepath.Base(bin), pid))
	cpuStart, _ := procStats(b, pid)
	createPaced(ctx, b, client, ns, sc.Writes, sc.Rate)
	select {
	case <-allDone:
	case <-time.After(2 * time.Minute): // bounded: what has not arrived by now is not delivered
	}
	cpuEnd, _ := procStats(b, pid)
	select { // the profile covers the writes; bounded, as every wait
	case <-profiled:
	case <-time.After(time.Minute):
	}

	// A stream that has carried an event holds more than one that has
	// not: x/net's response buffer, untouched until the first write, and,
	// where the handler encodes in it, the serving goroutine's stack.
	_, rssWritten := serverMemory(ctx, b, hc, cfg.Host, pid)
	heapWritten, stackWritten := liveHeap(ctx, b, hc, cfg.Host), stackInUse(ctx, b, hc, cfg.Host)
	saveHeapProfile(ctx, b, hc, cfg.Host, "BENCH_PROFILE_DIR", fmt.Sprintf("serve-%s-%d-written-heap.pprof", filepath.Base(bin), pid))

	// Churn: streams end and others open on the same names and
	// connections, from the head, as informers re-watch.
	head, err := client.FleetV1beta1().Assignments(ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		b.Fatal(err)
	}
	reopens := int(sc.churnRate * sc.churn.Seconds())
	churnProfiled := profileCPU(ctx, b, hc, cfg.Host, max(1, int(sc.churn.Seconds())), fmt.Sprintf("serve-%s-%d-churn-cpu.pprof", filepath.Base(bin), pid))
	cpuChurn, _ := procStats(b, pid)
	churnAt := time.Now()
	err = testkit.Paced(reopens, sc.churnRate, func(j int) error {
		i := j % sc.Count
		stops[i]()
		// The next watch once the last one has ended, as an informer's:
		// opened at once, it found its connection still at its limit of
		// streams, and the client dialled another, so that a TLS handshake
		// was a fifth of the churn's CPU.
		select {
		case <-ended[i]:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("stream %d still open 10 s after it was cancelled", i)
		}
		open(i, head.ResourceVersion)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	churnTook := time.Since(churnAt)
	cpuChurned, _ := procStats(b, pid)
	select { // bounded, as every wait
	case <-churnProfiled:
	case <-time.After(time.Minute):
	}

	mu.Lock()
	var latencies []time.Duration
	for _, r := range reads {
		if c, ok := commits.at(ns, r.name); ok {
			latencies = append(latencies, max(0, r.at.Sub(c)))
		}
	}
	mu.Unlock()
	n := float64(sc.Count)
	b.ReportMetric(float64(rssOpen-rssBefore)/n/1024, "KiB/stream")
	b.ReportMetric(float64(rssWritten-rssBefore)/n/1024, "written-KiB/stream")
	b.ReportMetric(float64(heapOpen-heapBefore)/n/1024, "heap-KiB/stream")
	b.ReportMetric(float64(heapWritten-heapBefore)/n/1024, "written-heap-KiB/stream")
	b.ReportMetric(float64(stackOpen)/n/1024, "stack-KiB/stream")
	b.ReportMetric(float64(stackWritten)/n/1024, "written-stack-KiB/stream")
	b.ReportMetric((goroutinesOpen-goroutinesBefore)/n, "goroutines/stream")
	b.ReportMetric((cpuOpened - cpuOpen).Seconds(), "open-cpu-s")
	b.ReportMetric(creates.Seconds(), "creates-cpu-s")
	if d := delivered.Load(); d > 0 {
		b.ReportMetric(float64((cpuEnd-cpuStart).Microseconds())/float64(d), "cpu-us/event")
		b.ReportMetric(float64((cpuEnd-cpuStart-creates).Microseconds())/float64(d), "delivery-us/event")
	}
	b.ReportMetric(idle, "idle-cores")
	if reopens > 0 {
		b.ReportMetric((cpuChurned-cpuChurn).Seconds()/churnTook.Seconds(), "churn-cores")
		aboveIdle := (cpuChurned - cpuChurn).Seconds() - idle*churnTook.Seconds()
		b.ReportMetric(aboveIdle*1e6/float64(reopens), "cpu-us/reopen")
	}
	b.ReportMetric(settled.Seconds(), "settle-s")
	b.ReportMetric((cpuEnd - cpuStart).Seconds(), "writes-cpu-s")
	b.ReportMetric(100*float64(delivered.Load())/n, "%delivered")
	b.ReportMetric(float64(closed.Load()), "closed")
	b.ReportMetric(float64(bookmarks.Load())/n, "bookmarks/stream")
	if len(latencies) > 0 {
		b.ReportMetric(ms(percentile(latencies, 0.5)), "p50-ms")
		b.ReportMetric(ms(percentile(latencies, 0.99)), "p99-ms")
		b.ReportMetric(ms(percentile(latencies, 1)), "max-ms")
	}
	if delivered.Load() != int64(sc.Count) {
		b.Errorf("%d of %d events delivered", delivered.Load(), sc.Count)
	}
}
