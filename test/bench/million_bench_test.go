package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// BenchmarkMillion is issue 66's measure of one replica at a million
// objects: MILLION_OBJECTS (1,000,000) Assignments of MILLION_BYTES (1024)
// bytes of JSON, written straight into one etcd (directLoad) in
// transactions of MILLION_PER_REVISION (128; 1 writes one object a
// revision, as writes through the API land). Each server then takes its
// turn over that etcd, put back as the load left it (frozenEtcd), for
// MILLION_ROUNDS rounds; MILLION_IMPLS and MILLION_ALT pick the servers as
// WATCHLIST_IMPLS and WATCHLIST_ALT do. A turn, with
// --storage-initialization-timeout raised so that the readiness hook's
// bound does not stand in for a cache's:
//
//   - a cold start (a new process, --watch-cache-warm-start-revisions=0),
//     then a warm restart (the defaults: ours fills its history from
//     etcd's): the time to /readyz 200 and to a list at resourceVersion 0
//     that serves the last object, the peak RSS (VmHWM) and the largest
//     heap in use seen until the start settled (cold-*, warm-*);
//   - MILLION_STEADY_SECONDS (120) after the warm restart was ready, with
//     100 writes/s going on from another process: the RSS and the heap
//     (after two collections), an object and against the objects' JSON
//     (steady-*); with MILLION_PROFILE_DIR, that heap's profile in
//     <dir>/<server>-steady-heap.pprof;
//   - full lists, MILLION_LIST_REPEATS (5) of each: one request with gzip
//     (consistent) and without (plain), at resourceVersion 0 (rv0), and as
//     kubectl pages them, 500 a page, as Tables (table500) and as JSON for
//     -o json (paged500): p50, p99, the first, and the server's CPU a list;
//     20 lists of a label value that matches nothing (label-none) and of
//     one spec.agentName (agent, a thousandth of the objects);
//   - MILLION_WATCHLISTS (10) watch-lists at once, as informers with
//     WatchListClient start: the time to the last one's
//     initial-events-end bookmark, the RSS they add, and the p99 of 100
//     writes/s beside them against MILLION_WRITES_ALONE (2,000) alone;
//   - 8 full lists at once: the RSS they add, and the writes' p99 beside.
//
// make bench-million runs it; make test runs it at 20,000 objects, every
// phase cut short, to check that it works.
func BenchmarkMillion(b *testing.B) {
	l := newUnloaded(b, "MILLION", 1_000_000)
	d := directLoadFor("MILLION", l.objects)
	m := millionRun{l: l, d: d, steady: time.Duration(testkit.EnvInt("MILLION_STEADY_SECONDS", 120)) * time.Second,
		repeats: testkit.EnvInt("MILLION_LIST_REPEATS", 5), watchLists: testkit.EnvInt("MILLION_WATCHLISTS", 10),
		aloneWrites: testkit.EnvInt("MILLION_WRITES_ALONE", 2000), startsOnly: testkit.EnvInt("MILLION_STARTS_ONLY", 0) != 0}
	b.Run(fmt.Sprintf("objects=%d/per-revision=%d", d.objects, d.perRevision), func(b *testing.B) {
		ctx := context.Background()
		cluster := startEtcdCluster(b, l.dir, d.etcdFlags()...)
		l.etcdURL = cluster.Endpoints()[0]
		l.etcd = etcdClient(b, l.etcdURL)
		m.loadTook, m.jsonBytes = d.run(ctx, b, l.etcd)
		m.etcd = freeze(b, cluster, l.etcd)
		l.eachTurn(b, m.turn)
	})
}

// millionRun is BenchmarkMillion's settings and its loaded etcd.
type millionRun struct {
	l    *loaded
	d    directLoad
	etcd *frozenEtcd
	// loadTook is how long the load took; jsonBytes is the mean stored
	// JSON of an object.
	loadTook  time.Duration
	jsonBytes float64
	// steady is how long after ready the steady memory is read.
	steady time.Duration
	// repeats is how many of each full list are timed; watchLists how many
	// watch-lists start at once; aloneWrites how many writes are timed
	// before them.
	repeats, watchLists, aloneWrites int
	// shapeChecked is set once a turn compared what the server stores
	// with what the loader wrote.
	shapeChecked bool
	// startsOnly ends each turn after its two starts: rounds of the starts
	// alone, several in the time of one whole turn of upstream's.
	startsOnly bool
}

// initTimeout is both servers' --storage-initialization-timeout: longer
// than any start measured, so that /readyz waits for the caches.
const initTimeout = 30 * time.Minute

// turn is one server's turn over the loaded etcd.
func (m *millionRun) turn(b *testing.B, impl serverBinary) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lap := laps(b)
	defer lap("stop")
	m.etcd.thaw(ctx, b)
	b.ReportMetric(m.loadTook.Seconds(), "load-s")
	lap("etcd restored")
	s := newScaleServer(b, impl.bin, filepath.Join(b.TempDir(), "server"), m.l.etcdURL)
	warm := append(s.args, "--storage-initialization-timeout="+initTimeout.String())
	s.args = append(slices.Clip(warm), "--watch-cache-warm-start-revisions=0")
	m.timedStart(ctx, b, s, false).report(b, "cold")
	s.stop(b)
	lap("cold start")
	s.args = warm
	st := m.timedStart(ctx, b, s, true)
	st.report(b, "warm")
	lap("warm start")
	cfg, hc, pid := st.cfg, st.hc, s.proc.Pid()
	base := cfg.Host + assignmentsPath
	if !m.shapeChecked {
		checkStoredShape(ctx, b, cfg, m.l.etcd, m.d)
		m.shapeChecked = true
	}
	if m.startsOnly {
		s.stop(b)
		return
	}

	var rss, heap int64
	writes := writesBeside(ctx, b, s.kubeconfig, func() {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(st.at.Add(st.list0 + m.steady))):
		}
		_, rss = procStats(b, pid)
		heap, _ = serverMemory(ctx, b, hc, cfg.Host, pid)
		if dir := os.Getenv("MILLION_PROFILE_DIR"); dir != "" {
			// Where the steady heap goes: in use after serverMemory's collections.
			if err := os.WriteFile(filepath.Join(dir, impl.name+"-steady-heap.pprof"), get(ctx, b, hc, cfg.Host+"/debug/pprof/heap"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	})
	objects := float64(m.l.objects)
	b.ReportMetric(float64(rss)/(1<<20), "steady-rss-MiB")
	b.ReportMetric(float64(heap)/(1<<20), "steady-heap-MiB")
	b.ReportMetric(float64(rss)/objects, "steady-rss-B/object")
	b.ReportMetric(float64(heap)/objects, "steady-heap-B/object")
	b.ReportMetric(float64(heap)/objects/m.jsonBytes, "steady-heap-per-json")
	b.ReportMetric(float64(st.peakRSS)/float64(rss), "warm-peak-per-steady-rss")
	b.ReportMetric(ms(percentile(writes, 0.99)), "steady-writes-p99-ms")
	lap("steady")

	checkSelectors(ctx, b, hc, base, m.l.objects)
	reportListLatencies(ctx, b, hc, base, pid, []listKind{
		{name: "consistent", repeats: m.repeats, mayFail: true},
		{name: "plain", encoding: "identity", repeats: m.repeats, mayFail: true},
		{name: "rv0", query: "resourceVersion=0", repeats: m.repeats, mayFail: true},
		{name: "table500", query: tableList.query, accept: tableList.accept, repeats: m.repeats},
		{name: "paged500", query: "limit=500", repeats: m.repeats},
		{name: "label-none", query: "labelSelector=group%3Dnone"},
		{name: "agent", query: "fieldSelector=spec.agentName%3Dagent-007"},
	})
	lap("lists")

	// The RSS the watch-lists and the lists at once add is a share of the
	// steady RSS. What each adds is counted from the RSS just before it,
	// which is what the phases before it left mapped: the RSS before, and
	// the peak, are reported over the steady RSS too, so that a phase that
	// left less mapped does not make the next one look larger (the 8
	// lists' share tripled when the lists before them got faster).
	before := resetPeakRSS(b, pid)
	b.ReportMetric(float64(before-rss)/float64(rss)*100, "rss-before-watchlists-over-steady-%")
	watchListRun(ctx, b, cfg, hc, base, watchListOpts{clients: m.watchLists, etcdURL: m.l.etcdURL, kubeconfig: s.kubeconfig,
		aloneWrites: m.aloneWrites, mayClose: true})
	peak := peakRSS(b, pid)
	b.ReportMetric(float64(peak-before)/float64(rss)*100, "rss-added-watchlists-%")
	b.ReportMetric(float64(peak-rss)/float64(rss)*100, "rss-peak-watchlists-over-steady-%")
	lap("watch-lists")

	var listsBefore, listsPeak int64
	var errs []error
	writes = writesBeside(ctx, b, s.kubeconfig, func() {
		listsBefore, listsPeak, _, errs = tryConcurrentListsRSS(ctx, b, hc, base, pid, 8)
	})
	if len(errs) > 0 {
		b.Logf("%d of 8 concurrent lists failed: %v", len(errs), errs[0])
	}
	b.ReportMetric(float64(len(errs)), "8lists-failed")
	b.ReportMetric(float64(listsPeak-listsBefore)/float64(rss)*100, "rss-added-8lists-%")
	b.ReportMetric(float64(listsBefore-rss)/float64(rss)*100, "rss-before-8lists-over-steady-%")
	b.ReportMetric(float64(listsPeak-rss)/float64(rss)*100, "rss-peak-8lists-over-steady-%")
	b.ReportMetric(ms(percentile(writes, 0.99)), "writes-during-8lists-p99-ms")
	lap("8 lists")
	s.stop(b)
}

// profileStart, when MILLION_PROFILE_DIR is set, takes a CPU profile of
// the server's first MILLION_PROFILE_SECONDS (50; the server ends a
// request at 60 s) from /debug/pprof, in the background, into
// <dir>/<server>-<cold|warm>.pprof: where a start's time goes (issue 66).
// It returns a function that waits for the profile, for the turn to call
// before it stops the server.
func profileStart(ctx context.Context, b *testing.B, hc *http.Client, host, server string, warm bool) func() {
	dir := os.Getenv("MILLION_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	kind := "cold"
	if warm {
		kind = "warm"
	}
	seconds := testkit.EnvInt("MILLION_PROFILE_SECONDS", 50)
	path := filepath.Join(dir, server+"-"+kind+".pprof")
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The server listens within milliseconds of its start; retry until
		// it answers. The profile's own request runs on ctx, not on the
		// poll's deadline, which it would outlast.
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			profile, err := tryGet(ctx, hc, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", host, seconds))
			if err != nil {
				return false, nil
			}
			return true, os.WriteFile(path, profile, 0o644)
		})
		if err != nil {
			b.Logf("no profile of the %s start: %v", kind, err)
		}
	}()
	return func() { <-done }
}

// laps returns a function that notes how long passed since it was last
// called, or since laps, under a name, and logs the laps when the
// benchmark ends: where a turn's time went.
func laps(b *testing.B) func(name string) {
	var took []string
	last := time.Now()
	b.Cleanup(func() { b.Logf("took: %s", strings.Join(took, ", ")) })
	return func(name string) {
		took = append(took, fmt.Sprintf("%s %v", name, time.Since(last).Round(time.Millisecond)))
		last = time.Now()
	}
}

// writesBeside runs f once another process creates an Assignment every
// 10 ms, until f returns, and returns the creates' times.
func writesBeside(ctx context.Context, b *testing.B, kubeconfig string, f func()) []time.Duration {
	stop, writing := make(chan struct{}), make(chan struct{})
	done := make(chan []time.Duration, 1)
	go func() { done <- writesFrom(ctx, b, kubeconfig, stop, 1<<30, writing) }()
	select {
	case <-writing:
		f()
		close(stop)
	case took := <-done:
		b.Fatalf("the writer process ended after %d writes, before f ran", len(took))
	}
	return <-done
}

// checkSelectors fails the benchmark unless the two selected lists it
// times select what the load wrote: none for the label, every thousandth
// object for the agent.
func checkSelectors(ctx context.Context, b *testing.B, hc *http.Client, base string, objects int) {
	want := objects / 1000
	if objects%1000 > 7 {
		want++
	}
	if got := bytes.Count(get(ctx, b, hc, base+"?fieldSelector=spec.agentName%3Dagent-007"), []byte(`"agentName":"agent-007"`)); got != want {
		b.Fatalf("spec.agentName=agent-007 selected %d objects, not %d", got, want)
	}
	if got := get(ctx, b, hc, base+"?labelSelector=group%3Dnone"); !bytes.Contains(got, []byte(`"items":[]`)) {
		b.Fatalf("group=none selected objects: %.300s", got)
	}
}

// started is one start of a server, as timedStart measured it.
type started struct {
	cfg *rest.Config
	hc  *http.Client
	// at is when the process started; readyz and list0 how long after it
	// /readyz answered 200 and a list at resourceVersion 0 served the last
	// loaded object.
	at            time.Time
	readyz, list0 time.Duration
	// peakRSS is the process's VmHWM once the start settled, peakHeap the
	// largest go_memstats_heap_inuse_bytes /metrics showed until then.
	peakRSS, peakHeap int64
}

// report reports the start's figures as <name>-*.
func (s started) report(b *testing.B, name string) {
	b.ReportMetric(ms(s.readyz), name+"-readyz-ms")
	b.ReportMetric(ms(s.list0), name+"-list0-ms")
	b.ReportMetric(float64(s.peakRSS)/(1<<20), name+"-peak-rss-MiB")
	b.ReportMetric(float64(s.peakHeap)/(1<<20), name+"-peak-heap-MiB")
}

// timedStart starts s and measures the start (started). It settles once
// the last object is served, and for a warm start once ours' history
// stopped filling (waitHistoryFilled).
func (m *millionRun) timedStart(ctx context.Context, b *testing.B, s *scaleServer, warm bool) started {
	st := started{at: time.Now()}
	s.start(b)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		if !s.proc.Running() {
			return false, errors.New("the server exited")
		}
		c, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
		st.cfg = c
		return err == nil, nil
	}); err != nil {
		b.Fatalf("the server wrote no kubeconfig: %v", err)
	}
	st.cfg.QPS, st.cfg.Burst = -1, -1
	var err error
	if st.hc, err = rest.HTTPClientFor(st.cfg); err != nil {
		b.Fatal(err)
	}
	host := st.cfg.Host
	profiled := profileStart(ctx, b, st.hc, host, filepath.Base(s.bin), warm)
	defer profiled() // before the server stops

	stopHeap := make(chan struct{})
	peakHeap := make(chan int64, 1)
	go func() {
		var peak float64
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if metrics, err := tryGet(ctx, st.hc, host+"/metrics"); err == nil {
				peak = max(peak, scrapeValue(string(metrics), "go_memstats_heap_inuse_bytes"))
			}
			select {
			case <-stopHeap:
				peakHeap <- int64(peak)
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	readyz := make(chan error, 1)
	go func() {
		readyz <- wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, initTimeout, true, func(ctx context.Context) (bool, error) {
			_, err := tryGet(ctx, st.hc, host+"/readyz")
			if err == nil {
				st.readyz = time.Since(st.at)
			}
			return err == nil, nil
		})
	}()
	waitCacheReady(ctx, b, st.hc, st.cfg.Host+assignmentsPath, m.l.objects)
	st.list0 = time.Since(st.at)
	if err := <-readyz; err != nil {
		b.Fatalf("/readyz never answered 200: %v", err)
	}
	if warm {
		// At a million written 128 to a revision, the backfill replays
		// 1.28 million events (issue 66).
		waitHistoryFilledWithin(ctx, b, st.hc, host, initTimeout)
	}
	st.peakRSS = peakRSS(b, s.proc.Pid())
	close(stopHeap)
	st.peakHeap = <-peakHeap
	return st
}
