package bench

import (
	"context"
	"math"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"k8s.io/client-go/rest"
)

// probes tells where a write's time goes while watch-lists stream, with
// BENCH_PROBES set: beside the writes, every 10 ms, a put straight to etcd
// (etcd and this process, not the server) and a GET /version (the server's
// HTTP, TLS and filters, not etcd: /version is no resource request, so the
// stream does not yield to it); and, over the phase, the server's Go
// scheduler latencies, the CPU the server, etcd and the machine used, and
// the server's allocations and garbage collections: while a collection
// marks, its workers take every processor the server leaves idle, and so
// the cores etcd needs.
type probes struct {
	b       *testing.B
	hc      *http.Client
	host    string
	etcdURL string
	etcd    *clientv3.Client
}

// newProbes returns probes of the server at cfg over etcdURL, or nil if
// BENCH_PROBES is not set or etcdURL is empty.
func newProbes(b *testing.B, cfg *rest.Config, etcdURL string) *probes {
	if os.Getenv("BENCH_PROBES") == "" || etcdURL == "" {
		return nil
	}
	hc, err := rest.HTTPClientFor(ownConnection(cfg))
	if err != nil {
		b.Fatal(err)
	}
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = etcd.Close() })
	return &probes{b: b, hc: hc, host: cfg.Host, etcdURL: etcdURL, etcd: etcd}
}

// probeSample is what the probes read at a phase's start and end.
type probeSample struct {
	at                 time.Time
	sched              histogram
	serverCPU, etcdCPU float64
	// gcCPU and gcCycles are the server's collections' CPU time and
	// count, allocs the bytes it allocated.
	gcCPU, gcCycles, allocs float64
	// busy and all are the machine's CPU time, busy and in all.
	busy, all float64
}

// histogram is a Prometheus histogram's cumulative counts by upper bound.
type histogram map[float64]float64

func (p *probes) sample(ctx context.Context) probeSample {
	s := probeSample{at: time.Now()}
	server := string(get(ctx, p.b, p.hc, p.host+"/metrics"))
	s.sched = scrapeHistogram(server, "go_sched_latencies_seconds")
	s.serverCPU = scrapeValue(server, "process_cpu_seconds_total")
	s.gcCPU = scrapeValue(server, "go_cpu_classes_gc_total_cpu_seconds_total")
	s.gcCycles = scrapeValue(server, "go_gc_cycles_total_gc_cycles_total")
	s.allocs = scrapeValue(server, "go_gc_heap_allocs_bytes_total")
	s.etcdCPU = scrapeValue(string(get(ctx, p.b, http.DefaultClient, p.etcdURL+"/metrics")), "process_cpu_seconds_total")
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		p.b.Fatal(err)
	}
	// cpu user nice system idle iowait irq softirq steal …
	for i, v := range strings.Fields(strings.SplitN(string(stat), "\n", 2)[0])[1:] {
		x, _ := strconv.ParseFloat(v, 64)
		s.all += x
		if i != 3 && i != 4 {
			s.busy += x
		}
	}
	return s
}

// scrapeValue returns the unlabelled sample name in metrics.
func scrapeValue(metrics, name string) float64 {
	for _, line := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// scrapeHistogram returns the buckets of the unlabelled histogram name.
func scrapeHistogram(metrics, name string) histogram {
	h := histogram{}
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, count, _ := strings.Cut(rest, `"} `)
		bound, err := strconv.ParseFloat(le, 64) // ParseFloat reads "+Inf"
		if err != nil {
			continue
		}
		h[bound], _ = strconv.ParseFloat(count, 64)
	}
	return h
}

// quantile returns the upper bound of the bucket that holds quantile q of
// what end counted since start.
func quantile(start, end histogram, q float64) float64 {
	var bounds []float64
	for le := range end {
		bounds = append(bounds, le)
	}
	if len(bounds) == 0 {
		return 0
	}
	sort.Float64s(bounds)
	total := end[bounds[len(bounds)-1]] - start[bounds[len(bounds)-1]]
	for _, le := range bounds {
		if end[le]-start[le] >= q*total {
			return le
		}
	}
	return math.Inf(1)
}

// run probes until stop is closed, or max rounds, and returns a function
// that waits for them and reports the phase's figures. A nil p probes
// nothing.
func (p *probes) run(ctx context.Context, phase string, stop <-chan struct{}, max int) (report func()) {
	if p == nil {
		return func() {}
	}
	start := p.sample(ctx)
	var puts, versions []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for range max {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			t0 := time.Now()
			if _, err := p.etcd.Put(ctx, "/probe", "x"); err != nil {
				p.b.Error(err)
				return
			}
			puts = append(puts, time.Since(t0))
			t0 = time.Now()
			get(ctx, p.b, p.hc, p.host+"/version")
			versions = append(versions, time.Since(t0))
		}
	}()
	return func() {
		<-done
		end := p.sample(ctx)
		secs := end.at.Sub(start.at).Seconds()
		p.b.ReportMetric(ms(percentile(puts, 0.99)), "probe-"+phase+"-etcd-put-p99-ms")
		p.b.ReportMetric(ms(percentile(versions, 0.99)), "probe-"+phase+"-version-p99-ms")
		// The server's histogram has a few wide buckets: this is the
		// bound of the one that holds the 99.9th percentile.
		p.b.ReportMetric(1000*quantile(start.sched, end.sched, 0.999), "probe-"+phase+"-sched-p999-ms")
		p.b.ReportMetric((end.serverCPU-start.serverCPU)/secs, "probe-"+phase+"-server-cores")
		p.b.ReportMetric((end.etcdCPU-start.etcdCPU)/secs, "probe-"+phase+"-etcd-cores")
		p.b.ReportMetric((end.gcCPU-start.gcCPU)/secs, "probe-"+phase+"-server-gc-cores")
		p.b.ReportMetric((end.gcCycles-start.gcCycles)/secs, "probe-"+phase+"-server-gc-per-s")
		p.b.ReportMetric((end.allocs-start.allocs)/secs/(1<<20), "probe-"+phase+"-server-alloc-mib-per-s")
		p.b.ReportMetric(float64(runtime.NumCPU())*(end.busy-start.busy)/(end.all-start.all), "probe-"+phase+"-machine-cores")
	}
}
