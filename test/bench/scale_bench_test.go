package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// scaleSize is one data set of BenchmarkScale.
type scaleSize struct {
	objects, payload int
	// watchLists is how many clients stream every object at once with
	// sendInitialEvents; fewer at 100,000 objects, where 100 would move
	// 13 GB through one 2-core machine.
	watchLists int
}

// BenchmarkScale loads each data set through our server and through the
// same server over upstream's Cacher, each over its own etcd, with etcd and
// the server in their own processes and this client in the test's, and
// reports memory, list latencies, the memory concurrent lists add, the
// watch-list start-up and its effect on writes, and the time to ready
// after a restart. make bench-scale runs it; docs/benchmarks.md has the
// numbers.
func BenchmarkScale(b *testing.B) {
	sizes := []scaleSize{
		{objects: 10_000, payload: 1024, watchLists: 100},
		{objects: 100_000, payload: 1024, watchLists: 10},
		{objects: 10_000, payload: 10 * 1024, watchLists: 100},
	}
	if f := os.Getenv("SCALE_OBJECTS"); f != "" {
		n, _ := strconv.Atoi(f)
		sizes = []scaleSize{{objects: n, payload: 1024, watchLists: 10}}
	}
	for _, sz := range sizes {
		for _, impl := range []string{"ours", "upstream"} {
			b.Run(fmt.Sprintf("objects=%d/payload=%d/impl=%s", sz.objects, sz.payload, impl), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					runScale(b, impl, sz)
				}
			})
		}
	}
}

// scaleServer is a server process that can be restarted on its data.
type scaleServer struct {
	bin  string
	args []string
	proc *testkit.Process
	// kubeconfig is where the server writes its kubeconfig.
	kubeconfig string
}

// startScaleEtcd starts a one-member etcd under dir with room for the
// largest data set (8 GiB of backend), and returns its client URL.
func startScaleEtcd(b *testing.B, dir string) string {
	return startEtcd(b, dir, "--quota-backend-bytes", strconv.Itoa(8<<30))
}

// newScaleServer is a server on a free port over etcdURL, keeping its
// certificates and kubeconfig in dataDir, with no bound on requests in
// flight: the benchmarks measure the cache, not the limits before it.
func newScaleServer(b *testing.B, bin, dataDir, etcdURL string) *scaleServer {
	return &scaleServer{bin: bin, args: []string{"--data-dir", dataDir, "--secure-port", strconv.Itoa(testkit.FreePort(b)),
		"--etcd-servers", etcdURL, "--max-requests-inflight", "0", "--max-mutating-requests-inflight", "0"},
		kubeconfig: filepath.Join(dataDir, "kubeconfig")}
}

func (s *scaleServer) start(b *testing.B) {
	s.proc = start(b, s.bin, s.args...)
}

// stop ends the server as SIGTERM does and waits for it.
func (s *scaleServer) stop(b *testing.B) {
	if err := s.proc.Terminate(time.Minute); err != nil {
		b.Fatal(err)
	}
}

func runScale(b *testing.B, impl string, sz scaleSize) {
	bins := build(b)
	dir := b.TempDir()
	etcdURL := startScaleEtcd(b, dir)
	srv := newScaleServer(b, filepath.Join(bins, impl), filepath.Join(dir, "server"), etcdURL)
	if impl == "ours" {
		// For an A/B of a flag in one run: SCALE_OURS_ARGS="--flag=value …".
		srv.args = append(srv.args, strings.Fields(os.Getenv("SCALE_OURS_ARGS"))...)
	}
	srv.start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := waitServing(ctx, b, srv.kubeconfig)
	client := versioned.NewForConfigOrDie(cfg)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	base := cfg.Host + assignmentsPath
	// The empty server's heap is in every figure an object below; at
	// 10,000 objects it is up to two fifths of them. drained-above-empty
	// takes it out: what the cache holds an object.
	empty, _ := serverMemory(ctx, b, hc, cfg.Host, srv.proc.Pid())
	b.ReportMetric(float64(empty)/(1<<20), "empty-heap-MiB")

	load(ctx, b, client, sz)
	heap, rss := serverMemory(ctx, b, hc, cfg.Host, srv.proc.Pid())
	b.ReportMetric(float64(heap)/float64(sz.objects), "heap-B/object")
	b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")

	reportListLatencies(ctx, b, hc, base, srv.proc.Pid(), []listKind{
		{name: "consistent"},
		{name: "rv0", query: "resourceVersion=0"},
		{name: "paged500", query: "limit=500"},
		{name: "label", query: "labelSelector=group%3Dg3"},
		{name: "field", query: "fieldSelector=spec.agentName%3Dagent-7"},
		tableList, v1alpha1List,
	})

	for _, n := range []int{8, 32} {
		added, took := concurrentListsRSS(ctx, b, hc, base, srv.proc.Pid(), n)
		b.ReportMetric(float64(added)/float64(rss)*100, fmt.Sprintf("rss-added-%dlists-%%", n))
		b.ReportMetric(ms(took), fmt.Sprintf("%dlists-all-ms", n))
	}

	watchListRun(ctx, b, cfg, hc, base, watchListOpts{clients: sz.watchLists, etcdURL: etcdURL,
		kubeconfig: srv.kubeconfig})
	// Ours keeps each encoding a watch asked for with the object it
	// encodes, for the watchers after, until 10 s pass without a send
	// (cacher.DefaultEncodingTTL); this is what stays once they went.
	waitNoEncodings(ctx, b, hc, cfg.Host)
	heap, _ = serverMemory(ctx, b, hc, cfg.Host, srv.proc.Pid())
	b.ReportMetric(float64(heap)/float64(sz.objects), "after-watchlists-heap-B/object")

	// A restart: time from the new process to a served list (a warm start
	// for ours, which fills its history behind it).
	// Its heap is the one with an empty history: the restarted caches hold
	// only the objects (ours replays up to 10,000 revisions of etcd's
	// history behind that, as --watch-cache-warm-start-revisions says).
	srv.stop(b)
	t0 := time.Now()
	srv.start(b)
	waitCacheReady(ctx, b, hc, base, sz.objects)
	b.ReportMetric(ms(time.Since(t0)), "restart-ready-ms")
	waitHistoryFilled(ctx, b, hc, cfg.Host)
	heap, rss = serverMemory(ctx, b, hc, cfg.Host, srv.proc.Pid())
	b.ReportMetric(float64(heap)/float64(sz.objects), "restarted-heap-B/object")
	b.ReportMetric(float64(rss)/(1<<20), "restarted-rss-MiB")

	// Once more with no history at all, as after it drained: ours starts
	// cold (upstream's cache ignores the flag and always does).
	srv.stop(b)
	srv.args = append(srv.args, "--watch-cache-warm-start-revisions=0")
	t0 = time.Now()
	srv.start(b)
	waitCacheReady(ctx, b, hc, base, sz.objects)
	b.ReportMetric(ms(time.Since(t0)), "restart-cold-ready-ms")
	heap, _ = serverMemory(ctx, b, hc, cfg.Host, srv.proc.Pid())
	b.ReportMetric(float64(heap)/float64(sz.objects), "drained-heap-B/object")
	b.ReportMetric(float64(heap-empty)/float64(sz.objects), "drained-above-empty-B/object")
	saveHeapProfile(ctx, b, hc, cfg.Host, "SCALE_HEAP_PROFILES", fmt.Sprintf("drained-%s-%d.pb.gz", impl, sz.objects))
}

// saveHeapProfile writes the heap profile of the server at host, after a
// collection, as name in the folder the environment variable env names,
// if it names one: for go tool pprof -diff_base, what each server holds.
func saveHeapProfile(ctx context.Context, b *testing.B, hc *http.Client, host, env, name string) {
	dir := os.Getenv(env)
	if dir == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name), get(ctx, b, hc, host+"/debug/pprof/heap?gc=1"), 0o644); err != nil {
		b.Fatal(err)
	}
}

// listKind is one kind of list a benchmark times.
type listKind struct {
	name, query, accept, version string
	// encoding is the Accept-Encoding asked for: gzip, as client-go's
	// transport asks, unless set ("identity" asks for none).
	encoding string
	// repeats is 20 unless set: a list that decodes every object takes long.
	repeats int
	// mayFail counts a list that fails in list-<name>-failed instead of
	// failing the benchmark: at a million objects a list can end on the
	// request timeout, and the figures of the rest are still wanted.
	mayFail bool
}

// url is base at the kind's version.
func (l listKind) url(base string) string {
	if l.version == "" {
		return base
	}
	return strings.Replace(base, "/v1beta1/", "/"+l.version+"/", 1)
}

// tableList is what kubectl get asks for: a Table, 500 rows a page.
// v1alpha1List is a full list at the version that is not stored. Both
// decode every object in ours, which keeps them as bytes.
var (
	tableList = listKind{name: "table500", query: "limit=500", repeats: 5,
		accept: "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"}
	v1alpha1List = listKind{name: "v1alpha1", version: "v1alpha1", repeats: 5}
)

// reportListLatencies times each kind of list of base's objects, every
// page, and reports its p50 and p99 as list-<name>-p50-ms and -p99-ms, and
// the CPU the server pid spent on a list, on average, as list-<name>-cpu-ms:
// on two shared cores a list's time moves with whatever else runs, its CPU
// much less. The first list's time is list-<name>-first-ms: ours compresses
// a gzip list's runs of objects once for the lists that follow, so the
// first is what a list costs when no other list sent the same objects.
func reportListLatencies(ctx context.Context, b *testing.B, hc *http.Client, base string, pid int, kinds []listKind) {
	for _, l := range kinds {
		var took []time.Duration
		var wire int64
		u := l.url(base)
		repeats := cmp.Or(l.repeats, 20)
		failed := 0
		cpu0, _ := procStats(b, pid)
		for range repeats {
			t0 := time.Now()
			n, err := tryListAll(ctx, hc, u, l.query, cmp.Or(l.accept, "application/json"), cmp.Or(l.encoding, "gzip"))
			took = append(took, time.Since(t0))
			switch {
			case err == nil:
				wire = n
			case !l.mayFail:
				b.Fatal(err)
			default:
				if failed == 0 {
					b.Logf("list-%s failed after %v: %v", l.name, took[len(took)-1], err)
				}
				failed++
			}
		}
		cpu1, _ := procStats(b, pid)
		if l.mayFail {
			b.ReportMetric(float64(failed), "list-"+l.name+"-failed")
		}
		b.ReportMetric(ms(percentile(took, 0.5)), "list-"+l.name+"-p50-ms")
		b.ReportMetric(ms(percentile(took, 0.99)), "list-"+l.name+"-p99-ms")
		b.ReportMetric(ms(took[0]), "list-"+l.name+"-first-ms")
		b.ReportMetric(ms((cpu1-cpu0)/time.Duration(repeats)), "list-"+l.name+"-cpu-ms")
		b.ReportMetric(float64(wire)/(1<<20), "list-"+l.name+"-wire-MiB")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// waitCacheReady polls, without client-go's retries after 429, for the
// last object loaded through an RV 0 list, which both caches serve only
// once they hold every object (upstream's answers 429 before, as ours does;
// a consistent list would not do: upstream's goes to etcd while its cache
// is not ready).
func waitCacheReady(ctx context.Context, b *testing.B, hc *http.Client, base string, objects int) {
	url := fmt.Sprintf("%s?resourceVersion=0&fieldSelector=metadata.name%%3Da-%06d", base, objects-1)
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(fmt.Sprintf(`"a-%06d"`, objects-1))), nil
	})
	if err != nil {
		b.Fatalf("the cache never served the last object after the restart: %v", err)
	}
}

// load creates the data set through the server with 32 writers.
func load(ctx context.Context, b *testing.B, client versioned.Interface, sz scaleSize) {
	payload := strings.Repeat("x", sz.payload)
	writeEach(ctx, b, sz.objects, func(ctx context.Context, i int) error {
		ns, name := assignmentAt(i)
		a := &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{"group": fmt.Sprintf("g%d", i%10)}, Annotations: map[string]string{"payload": payload}},
			Spec: v1beta1.AssignmentSpec{AgentName: fmt.Sprintf("agent-%d", i%100)}}
		_, err := client.FleetV1beta1().Assignments(ns).Create(ctx, a, metav1.CreateOptions{})
		return err
	})
}

// assignmentAt returns the namespace and name load gives its i-th object.
func assignmentAt(i int) (ns, name string) {
	return fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("a-%06d", i)
}

// writeEach calls write for 0 to n-1 from 32 writers, and fails the
// benchmark with the first error, after which no writer starts another.
func writeEach(ctx context.Context, b *testing.B, n int, write func(ctx context.Context, i int) error) {
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range 32 {
		g.Go(func() error {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := write(ctx, i); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// serverMemory collects garbage in the server twice (its heap profile with
// gc=1), then reads its heap in use from /metrics and its RSS.
//
// Twice, because a sync.Pool keeps what was put in it through one
// collection and drops it at the next. etcd's gRPC client pools its receive
// buffers: after a start that read 100 MB from etcd, one collection left
// 32 MB of them in use (a heap profile of every allocation, 10,000 objects
// of 10 KiB: 3.2 KiB an object, in mem.SimpleBufferPool and
// sizedBufferPool), which the second freed. Any later collection frees them
// too, so they are no part of what a server holds.
func serverMemory(ctx context.Context, b *testing.B, hc *http.Client, host string, pid int) (heap, rss int64) {
	get(ctx, b, hc, host+"/debug/pprof/heap?gc=1")
	get(ctx, b, hc, host+"/debug/pprof/heap?gc=1")
	heap = int64(scrapeValue(string(get(ctx, b, hc, host+"/metrics")), "go_memstats_heap_inuse_bytes"))
	if heap == 0 {
		b.Fatal("no go_memstats_heap_inuse_bytes in /metrics")
	}
	_, rss = procStats(b, pid)
	return heap, rss
}

// liveHeap returns the heap the server's objects take, without the free
// slots of the spans that hold them (go_memstats_heap_alloc_bytes): read
// right after serverMemory's collection, what is live. The heap in use
// less this is fragmentation, which moves with what else was allocated
// beside the objects.
func liveHeap(ctx context.Context, b *testing.B, hc *http.Client, host string) int64 {
	return int64(scrapeValue(string(get(ctx, b, hc, host+"/metrics")), "go_memstats_heap_alloc_bytes"))
}

// stackInUse returns the memory the server's goroutine stacks take
// (go_memstats_stack_inuse_bytes).
func stackInUse(ctx context.Context, b *testing.B, hc *http.Client, host string) int64 {
	return int64(scrapeValue(string(get(ctx, b, hc, host+"/metrics")), "go_memstats_stack_inuse_bytes"))
}

// unreturnedHeap returns the heap the server's Go runtime holds free and
// has not returned to the system (idle minus released): memory a peak
// left, which the RSS counts and the heap in use does not.
func unreturnedHeap(ctx context.Context, b *testing.B, hc *http.Client, host string) int64 {
	metrics := string(get(ctx, b, hc, host+"/metrics"))
	return int64(scrapeValue(metrics, "go_memstats_heap_idle_bytes") - scrapeValue(metrics, "go_memstats_heap_released_bytes"))
}

// waitNoEncodings waits until no cached object of ours holds encodings,
// as cached_apiserver_watch_cache_encoded_objects says. Upstream's server
// has no such gauge: its cache keeps no encodings once an event went out.
func waitNoEncodings(ctx context.Context, b *testing.B, hc *http.Client, host string) {
	const gauge = "cached_apiserver_watch_cache_encoded_objects{"
	var held string
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		held = ""
		for _, line := range strings.Split(string(get(ctx, b, hc, host+"/metrics")), "\n") {
			if strings.HasPrefix(line, gauge) && !strings.HasSuffix(line, " 0") {
				held = line
			}
		}
		return held == "", nil
	}); err != nil {
		b.Fatalf("encodings still held after a minute: %s", held)
	}
}

// waitHistoryFilled waits, on our server, for a warm start's backfill to
// end: until the cache's history_events gauge is above 0 and has not moved
// for 2 s. Upstream's cache, which has no such gauge, fills no history.
func waitHistoryFilled(ctx context.Context, b *testing.B, hc *http.Client, host string) {
	waitHistoryFilledWithin(ctx, b, hc, host, 2*time.Minute)
}

// waitHistoryFilledWithin is waitHistoryFilled failing after within.
func waitHistoryFilledWithin(ctx context.Context, b *testing.B, hc *http.Client, host string, within time.Duration) {
	const gauge = `cached_apiserver_watch_cache_history_events{group="fleet.example.com",resource="assignments"} `
	var last string
	var since time.Time
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		v, found := "", false
		for _, line := range strings.Split(string(get(ctx, b, hc, host+"/metrics")), "\n") {
			if rest, ok := strings.CutPrefix(line, gauge); ok {
				v, found = rest, true
			}
		}
		switch {
		case !found:
			return true, nil
		case v != last:
			last, since = v, time.Now()
			return false, nil
		}
		return v != "0" && time.Since(since) >= 2*time.Second, nil
	}); err != nil {
		b.Fatalf("the history did not settle within %v: %s events", within, last)
	}
}

func get(ctx context.Context, b *testing.B, hc *http.Client, url string) []byte {
	body, err := tryGet(ctx, hc, url)
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// tryGet is get, returning what failed: an error, or an answer but 200.
func tryGet(ctx context.Context, hc *http.Client, url string) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %d %v %.200s", url, resp.StatusCode, err, body)
	}
	return body, nil
}

// listAll lists with query, following continue tokens, and discards the
// bytes: the client decodes nothing, so that the 2 cores go to the server.
func listAll(ctx context.Context, b *testing.B, hc *http.Client, base, query, accept string) (wire int64) {
	wire, err := tryListAll(ctx, hc, base, query, accept, "gzip")
	if err != nil {
		b.Fatal(err)
	}
	return wire
}

// tryListAll is listAll asking for the Accept-Encoding encoding, returning
// what failed.
func tryListAll(ctx context.Context, hc *http.Client, base, query, accept, encoding string) (wire int64, err error) {
	cont := ""
	for {
		url := base + "?" + query
		if cont != "" {
			url += "&continue=" + cont
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Accept", accept)
		// Set, as the transport would set gzip, so that it hands the body
		// on compressed and the bytes on the wire can be counted.
		req.Header.Set("Accept-Encoding", encoding)
		resp, err := hc.Do(req)
		if err != nil {
			return wire, err
		}
		var n int64
		cont, n, err = readList(resp)
		wire += n
		if err != nil {
			return wire, fmt.Errorf("GET %s: %w", url, err)
		}
		if cont == "" {
			return wire, nil
		}
	}
}

// readList reads and discards a list's response, and returns its continue
// token and the bytes read off the wire.
func readList(resp *http.Response) (cont string, wire int64, err error) {
	defer resp.Body.Close()
	counted := &countingReader{r: resp.Body}
	body := io.Reader(counted)
	if resp.Header.Get("Content-Encoding") == "gzip" {
		if body, err = gzip.NewReader(counted); err != nil {
			return "", counted.n, err
		}
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(body)
		return "", counted.n, fmt.Errorf("%d %.300s", resp.StatusCode, msg)
	}
	// The continue token is in the list's metadata, before the items.
	br := bufio.NewReaderSize(body, 64<<10)
	head, _ := br.Peek(4096)
	cont = continueToken(head)
	_, err = io.Copy(io.Discard, br)
	return cont, counted.n, err
}

func continueToken(head []byte) string {
	const key = `"continue":"`
	i := bytes.Index(head, []byte(key))
	if i < 0 {
		return ""
	}
	rest := head[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

// concurrentListsRSS runs n full consistent lists at once and returns how
// much they raised the server's peak RSS (VmHWM, reset first), and the
// time until the last one was read. A list that fails fails the benchmark.
func concurrentListsRSS(ctx context.Context, b *testing.B, hc *http.Client, base string, pid, n int) (int64, time.Duration) {
	before, peak, took, errs := tryConcurrentListsRSS(ctx, b, hc, base, pid, n)
	if len(errs) > 0 {
		b.Fatal(errors.Join(errs...))
	}
	return peak - before, took
}

// tryConcurrentListsRSS runs n full consistent lists at once, and returns
// the server's RSS before them and its peak RSS (VmHWM, reset first) by
// the time the last one was read, that time, and the errors of the lists
// that failed.
func tryConcurrentListsRSS(ctx context.Context, b *testing.B, hc *http.Client, base string, pid, n int) (before, peak int64, took time.Duration, _ []error) {
	before = resetPeakRSS(b, pid)
	t0 := time.Now()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = tryListAll(ctx, hc, base, "", "application/json", "gzip")
		})
	}
	wg.Wait()
	return before, peakRSS(b, pid), time.Since(t0), slices.DeleteFunc(errs, func(err error) bool { return err == nil })
}

// resetPeakRSS resets the peak RSS of process pid (VmHWM) to its RSS, and
// returns that.
func resetPeakRSS(b *testing.B, pid int) int64 {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		b.Fatalf("resetting the peak RSS: %v", err)
	}
	_, rss := procStats(b, pid)
	return rss
}

func peakRSS(b *testing.B, pid int) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return kb * 1024
		}
	}
	b.Fatal("no VmHWM")
	return 0
}

// watchListOpts shapes watchListRun.
type watchListOpts struct {
	// clients is how many watch-lists stream at once.
	clients int
	// warmUp writes for 10 s, not measured, before the writes alone.
	warmUp bool
	// etcdURL is the server's etcd, for probes (BENCH_PROBES).
	etcdURL string
	// kubeconfig is the server's, for the writer process.
	kubeconfig string
	// aloneWrites is how many writes are timed alone, before the
	// watch-lists: 2,000 unless set.
	aloneWrites int
	// mayClose counts a watch-list that ends before its initial events in
	// watchlist-closed, instead of failing the benchmark, and leaves it out
	// of the times: upstream's cache closes a watcher whose buffer, about a
	// second of events, the writes filled while it sent the initial events.
	mayClose bool
	// version is the API version the watch-lists ask for: "" is base's,
	// the storage version, whose objects ours sends as they are cached;
	// another one is converted and encoded for the watchers.
	version string
}

// watchListRun measures writes at 100/s alone, then beside clients that
// each stream every object with sendInitialEvents, and reports the time
// to each client's initial-events-end bookmark and the writes' p99 both ways.
func watchListRun(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, opts watchListOpts) {
	// The writer is another client, as a controller would be: a process
	// of its own (writer_process_test.go), with its own connection.
	writes := func(stop <-chan struct{}, max int) []time.Duration {
		return writesFrom(ctx, b, opts.kubeconfig, stop, max, nil)
	}
	// Writes in the first seconds after a start are slower, while the
	// start's garbage is collected (p99 up to 40 ms within 30 s of a
	// restart): 10 s of them, not measured, keep that out of the figure
	// for servers measured right after they start.
	if opts.warmUp {
		writes(nil, 1000)
	}
	// 20 s of writes alone, of the order of those beside the watch-lists
	// (20 to 45 s), so that both p99s rest on a like number of samples:
	// with 500 the p99 alone was the fifth-slowest write and varied 2×
	// between repeats.
	probes := newProbes(b, cfg, opts.etcdURL)
	stopAlone := make(chan struct{})
	aloneWrites := cmp.Or(opts.aloneWrites, 2000)
	reportAlone := probes.run(ctx, "alone", stopAlone, aloneWrites)
	alone := writes(nil, aloneWrites)
	close(stopAlone)
	reportAlone()

	stop := make(chan struct{})
	during := make(chan []time.Duration, 1)
	// Until the watch-lists end, however long they take (minutes at a
	// million objects).
	go func() { during <- writes(stop, 1<<30) }()
	reportDuring := probes.run(ctx, "during", stop, 60*100)
	var wg sync.WaitGroup
	var closed atomic.Int64
	ends := make([]time.Duration, opts.clients)
	// wire is what each watch-list read off the connection, compressed,
	// until its initial-events-end.
	wire := make([]int64, opts.clients)
	url := base + "?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
	if opts.version != "" {
		url = strings.Replace(url, "/v1beta1/", "/"+opts.version+"/", 1)
	}
	t0 := time.Now()
	if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
		go profile(ctx, cfg, "profile", filepath.Join(dir, fmt.Sprintf("watchlists-%d.pprof", opts.clients)))
		go profile(ctx, cfg, "allocs", filepath.Join(dir, fmt.Sprintf("watchlists-%d-allocs.pprof", opts.clients)))
	}
	if dir := os.Getenv("BENCH_TRACE_DIR"); dir != "" {
		go profile(ctx, cfg, "trace", filepath.Join(dir, fmt.Sprintf("watchlists-%d-%d.trace", opts.clients, time.Now().UnixNano())))
	}
	for i := range opts.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			// Asked for, as the transport would, so that it hands the body on
			// compressed and the bytes on the wire can be counted.
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := hc.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			defer resp.Body.Close()
			counted := &countingReader{r: resp.Body}
			defer func() { wire[i] = counted.n }()
			body := io.Reader(counted)
			if resp.Header.Get("Content-Encoding") == "gzip" {
				if body, err = gzip.NewReader(counted); err != nil {
					b.Error(err)
					return
				}
			}
			br := bufio.NewReaderSize(body, 1<<20)
			var last []byte
			for {
				line, err := br.ReadSlice('\n')
				if err == bufio.ErrBufferFull {
					continue
				}
				if err != nil && opts.mayClose {
					closed.Add(1)
					return
				}
				if err != nil {
					b.Errorf("watch-list %d ended before its initial events: %v; last read: %.300s", i, err, last)
					return
				}
				last = append(last[:0], line...)
				if bytes.Contains(line, []byte(`"k8s.io/initial-events-end":"true"`)) {
					ends[i] = time.Since(t0)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	duringTook := <-during
	reportDuring()
	if opts.mayClose {
		b.ReportMetric(float64(closed.Load()), "watchlist-closed")
		ends = slices.DeleteFunc(ends, func(d time.Duration) bool { return d == 0 })
	}
	if len(ends) > 0 {
		b.ReportMetric(ms(percentile(ends, 0.5)), "watchlist-end-p50-ms")
		b.ReportMetric(ms(percentile(ends, 1)), "watchlist-end-max-ms")
	}
	slices.Sort(wire)
	b.ReportMetric(float64(wire[len(wire)/2])/(1<<20), "watchlist-wire-MiB")
	b.ReportMetric(ms(percentile(alone, 0.99)), "writes-alone-p99-ms")
	if len(duringTook) > 0 {
		b.ReportMetric(ms(percentile(duringTook, 0.99)), "writes-during-watchlists-p99-ms")
	}
}

// ownConnection returns a copy of cfg whose clients get a transport, and so
// connections, of their own: client-go shares one transport between configs
// with the same TLS settings unless a dialer is set.
func ownConnection(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Dial = (&net.Dialer{}).DialContext
	return c
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
