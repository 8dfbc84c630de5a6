package integration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// BenchmarkServeBehindAggregator is issue 57's single-object streams where
// real clients meet the server: through the kube-aggregator. SERVE_STREAMS
// (10,000) watches, each of one name with bookmarks on, are opened through
// kube-apiserver, SERVE_PER_CONN (100) to a client connection, as agents
// arrive, by a user under the bench's FlowSchema (gatesFlowControl); then
// SERVE_WRITES (1,000) creates at SERVE_RATE (50/s) deliver one event to
// every stream. kube-apiserver proxies each stream to the backend over its
// own HTTP/2 connections.
//
// It prints, for our server and upstream's wiring (test/bench/cmd/server-upstream,
// the generic server's defaults), medians and ranges over SERVE_ROUNDS (3),
// a control plane each: what a stream costs the backend and kube-apiserver
// in RSS (after a collection in each), the CPU each spent opening the
// streams and during the writes, idle CPU over SERVE_IDLE_SECONDS (60) once
// the opening settled, the latency from a create's request to the stream's
// client reading its event, and the streams closed. SERVE_VARIANTS picks
// among ours, upstream and sample-apiserver, upstream's sample-apiserver
// v0.37.2 as its users run it (startSampleAPIServer), watched the same
// way. make bench-serve-aggregated runs it.
func BenchmarkServeBehindAggregator(b *testing.B) {
	sc := testkit.StreamsFromEnv(testkit.Streams{Count: 10_000, PerConn: 100, Writes: 1_000, Rate: 50, Idle: time.Minute})
	var variants []gatesVariant
	for _, name := range strings.Split(cmp.Or(os.Getenv("SERVE_VARIANTS"), "ours,upstream"), ",") {
		switch name {
		case "ours", "sample-apiserver":
			variants = append(variants, gatesVariant{name: name})
		case "upstream":
			variants = append(variants, gatesVariant{name: name, bin: testkit.Build(b, testkit.Upstream)[0]})
		default:
			b.Fatalf("SERVE_VARIANTS: no variant %q; there are ours, upstream and sample-apiserver", name)
		}
	}
	rounds := testkit.EnvInt("SERVE_ROUNDS", 3)
	results := map[string][]aggServeResult{}
	for round := range rounds {
		for _, v := range variants {
			b.Run(fmt.Sprintf("%s/round=%d", v.name, round), func(b *testing.B) {
				r := runServeBehindAggregator(b, sc, v)
				b.Logf("%s, round %d: %+v", v.name, round, r)
				results[v.name] = append(results[v.name], r)
			})
		}
	}
	rows := []struct {
		name, format string
		f            func(aggServeResult) float64
	}{
		{"backend RSS per stream, KiB", "%.1f", func(r aggServeResult) float64 { return r.backendKiB }},
		{"kube-apiserver RSS per stream, KiB", "%.1f", func(r aggServeResult) float64 { return r.kasKiB }},
		{"backend CPU to open, s", "%.1f", func(r aggServeResult) float64 { return r.backendOpen.Seconds() }},
		{"kube-apiserver CPU to open, s", "%.1f", func(r aggServeResult) float64 { return r.kasOpen.Seconds() }},
		{"backend CPU during the writes, s", "%.1f", func(r aggServeResult) float64 { return r.backendWrites.Seconds() }},
		{"kube-apiserver CPU during the writes, s", "%.1f", func(r aggServeResult) float64 { return r.kasWrites.Seconds() }},
		{"backend idle, cores", "%.3f", func(r aggServeResult) float64 { return r.backendIdle }},
		{"kube-apiserver idle, cores", "%.3f", func(r aggServeResult) float64 { return r.kasIdle }},
		{"delivery p50, ms", "%.1f", func(r aggServeResult) float64 { return ms(r.p50) }},
		{"delivery p99, ms", "%.1f", func(r aggServeResult) float64 { return ms(r.p99) }},
		{"delivery max, ms", "%.0f", func(r aggServeResult) float64 { return ms(r.max) }},
		{"closed", "%.0f", func(r aggServeResult) float64 { return float64(r.closed) }},
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nthrough kube-apiserver: %d streams, %d to a client connection, %d creates at %.0f/s; median (min–max) of %d rounds\n\n",
		sc.Count, sc.PerConn, sc.Writes, sc.Rate, rounds)
	fmt.Fprintln(&out, "| | ours | upstream | ours ÷ upstream | sample-apiserver |\n|---|---|---|---|---|")
	for _, row := range rows {
		ours, up := results["ours"], results["upstream"]
		fmt.Fprintf(&out, "| %s | %s | %s | %s | %s |\n", row.name, spread(ours, row.f, row.format), spread(up, row.f, row.format),
			ratio(median(ours, row.f), median(up, row.f)), spread(results["sample-apiserver"], row.f, row.format))
	}
	fmt.Print(out.String())
}

// aggServeResult is one variant's run.
type aggServeResult struct {
	backendKiB, kasKiB       float64
	backendOpen, kasOpen     time.Duration
	backendWrites, kasWrites time.Duration
	backendIdle, kasIdle     float64
	p50, p99, max            time.Duration
	closed, delivered        int64
}

// serveTarget is what a variant's streams watch and its writes create.
type serveTarget struct {
	// proc serves them behind kube-apiserver; admin reaches it directly.
	proc  *testkit.Process
	admin *serveHTTP
	// path is the collection, and rv a resourceVersion to watch from.
	path, rv string
	// create creates the object name through kube-apiserver.
	create func(ctx context.Context, name string) error
}

func runServeBehindAggregator(b *testing.B, sc testkit.Streams, v gatesVariant) aggServeResult {
	srv := &asProcess{bin: v.bin, extra: []string{"--max-watches=0"}}
	if v.name == "sample-apiserver" {
		srv = &asProcess{} // ours, idle beside it: the control plane is built around it
	}
	cp := startControlPlaneWith(b, srv, gatesNamespace)
	defer cp.stopServer()
	writer := cp.user(b, gatesWriter, gatesGroup)
	gatesFlowControl(b, cp, writer)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var t serveTarget
	if v.name == "sample-apiserver" {
		t = startSampleAPIServer(ctx, b, cp)
	} else {
		list, err := writer.FleetV1beta1().Assignments(gatesNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		t = serveTarget{proc: srv.proc, admin: serveClient(b, cp.direct(b, "bench-admin", user.SystemPrivilegedGroup)),
			path: "/apis/fleet.example.com/v1beta1/namespaces/" + gatesNamespace + "/assignments", rv: list.ResourceVersion,
			create: func(ctx context.Context, name string) error {
				a := &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.AssignmentSpec{AgentName: name}}
				_, err := writer.FleetV1beta1().Assignments(gatesNamespace).Create(ctx, a, metav1.CreateOptions{})
				return err
			}}
	}
	watcher := cp.userConfig(b, gatesWatcher, gatesGroup)
	front := serveClient(b, cp.Front.Config)
	memory := func() (backend, kas int64) {
		collect(ctx, b, t.admin)
		collect(ctx, b, front)
		return rss(b, t.proc), rss(b, cp.KAS)
	}
	cpu := func() (backend, kas time.Duration) { return cpuOf(b, t.proc), cpuOf(b, cp.KAS) }

	// kube-apiserver's start and the deployment over.
	if _, err := testkit.Settle(ctx, t.proc, cp.KAS); err != nil {
		b.Fatal(err)
	}
	backendBefore, kasBefore := memory()
	base := watcher.Host + t.path
	var delivered, closed atomic.Int64
	var mu sync.Mutex // guards sent and read
	sent := map[string]time.Time{}
	var read []time.Duration
	allDone := make(chan struct{})
	var doneOnce sync.Once
	onEvent := func(name string, at time.Time) {
		mu.Lock()
		if t, ok := sent[name]; ok {
			read = append(read, at.Sub(t))
		}
		mu.Unlock()
		if delivered.Add(1) == int64(sc.Count) {
			doneOnce.Do(func() { close(allDone) })
		}
	}
	var rejected atomic.Int64
	backendCPU0, kasCPU0 := cpu()
	var conn *http.Client
	for i := range sc.Count {
		if i%sc.PerConn == 0 {
			c := rest.CopyConfig(watcher)
			c.Dial = (&net.Dialer{}).DialContext // a transport, and so a connection, of its own
			var err error
			if conn, err = rest.HTTPClientFor(c); err != nil {
				b.Fatal(err)
			}
		}
		q := url.Values{"watch": {"1"}, "allowWatchBookmarks": {"true"}, "resourceVersion": {t.rv},
			"fieldSelector": {"metadata.name=" + fmt.Sprintf("a-%05d", i%sc.Writes)}}
		body := get(ctx, b, conn, base+"?"+q.Encode(), &rejected)
		go testkit.ReadWatch(ctx, body, testkit.WatchCallbacks{Event: onEvent, Closed: func() { closed.Add(1) }})
	}
	backendCPU1, kasCPU1 := cpu()
	var r aggServeResult
	r.backendOpen, r.kasOpen = backendCPU1-backendCPU0, kasCPU1-kasCPU0
	if _, err := testkit.Settle(ctx, t.proc, cp.KAS); err != nil {
		b.Fatal(err)
	}
	backendOpen, kasOpen := memory()
	n := float64(sc.Count)
	r.backendKiB, r.kasKiB = float64(backendOpen-backendBefore)/n/1024, float64(kasOpen-kasBefore)/n/1024
	backendIdle0, kasIdle0 := cpu()
	time.Sleep(sc.Idle) // the idle window itself
	backendIdle1, kasIdle1 := cpu()
	r.backendIdle, r.kasIdle = (backendIdle1-backendIdle0).Seconds()/sc.Idle.Seconds(), (kasIdle1-kasIdle0).Seconds()/sc.Idle.Seconds()

	backendW0, kasW0 := cpu()
	if err := testkit.Paced(sc.Writes, sc.Rate, func(i int) error {
		name := fmt.Sprintf("a-%05d", i)
		mu.Lock()
		sent[name] = time.Now()
		mu.Unlock()
		return createRetried(ctx, t.create, name)
	}); err != nil {
		b.Fatal(err)
	}
	select {
	case <-allDone:
	case <-time.After(2 * time.Minute): // bounded: what has not arrived by now is not delivered
	}
	backendW1, kasW1 := cpu()
	r.backendWrites, r.kasWrites = backendW1-backendW0, kasW1-kasW0
	mu.Lock()
	slices.Sort(read)
	if len(read) > 0 {
		r.p50, r.p99, r.max = read[len(read)/2], read[len(read)*99/100], read[len(read)-1]
	}
	mu.Unlock()
	r.delivered, r.closed = delivered.Load(), closed.Load()
	if r.delivered != int64(sc.Count) {
		b.Errorf("%d of %d events delivered", r.delivered, sc.Count)
	}
	if rejected.Load() > 0 {
		b.Logf("%d watch requests met 429 and were retried", rejected.Load())
	}
	return r
}

// createRetried creates name, again if the client's connection to
// kube-apiserver was closed under it, as any client retries. The first
// write after the idle minute met a connection the HTTP/2 client had just
// closed, in every round of sample-apiserver's run: a create that did
// arrive is then AlreadyExists.
func createRetried(ctx context.Context, create func(context.Context, string) error, name string) error {
	err := create(ctx, name)
	for attempt := 0; attempt < 3 && errors.Is(err, net.ErrClosed); attempt++ {
		if err = create(ctx, name); apierrors.IsAlreadyExists(err) {
			return nil
		}
	}
	return err
}

// serveClient is an HTTP client for cfg's server.
func serveClient(b *testing.B, cfg *rest.Config) *serveHTTP {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return &serveHTTP{hc: hc, host: cfg.Host}
}

type serveHTTP struct {
	hc   *http.Client
	host string
}

// collect has the server collect its garbage twice, as the heap profile
// with gc=1 does, so that its RSS holds what is live.
func collect(ctx context.Context, b *testing.B, s *serveHTTP) {
	var rejected atomic.Int64
	for range 2 {
		body := get(ctx, b, s.hc, s.host+"/debug/pprof/heap?gc=1", &rejected)
		body.Close()
	}
}

func rss(b *testing.B, p *testkit.Process) int64 {
	v, err := p.RSS()
	if err != nil {
		b.Fatal(err)
	}
	return v
}

func cpuOf(b *testing.B, p *testkit.Process) time.Duration {
	v, err := p.CPU()
	if err != nil {
		b.Fatal(err)
	}
	return v
}

func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}
