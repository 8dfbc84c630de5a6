package faults

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

var (
	chaos      = flag.Bool("chaos", false, "run every scenario against both servers, and every injected fault (make chaos)")
	reportPath = flag.String("report", "", "append the results as a Markdown table to this file")
	soakFor    = flag.Duration("soak", 0, "run the chaos soak for this long instead of the scenarios (make soak)")
	seedFlag   = flag.Uint64("seed", 0, "the seed of every run (the soak's faults, and every run's traffic); 0 takes one from the clock (the log prints it)")
	rbSeeds    = flag.Int("robustness.seeds", 1, "seeds of each profile TestRobustness runs")
)

// newSeed is the seed of a run: -seed, or a random one, which the run's
// log prints so that it can be replayed.
func newSeed() uint64 {
	if *seedFlag != 0 {
		return *seedFlag
	}
	return rand.Uint64()
}

// shortScenarios are the scenarios make test runs against upstream
// beside ours, which runs every scenario: those where replicas go, that
// both must ride through, and the leader loss this project was once worse
// at. make chaos runs every scenario against both.
var shortScenarios = map[string]bool{
	"leader loss":                  true,
	"replica killed":               true,
	"rolling restart, 500 watches": true,
}

var (
	resultsMu sync.Mutex
	results   []*result
)

func record(r *result) {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	results = append(results, r)
}

func TestMain(m *testing.M) {
	flag.Parse()
	longEtcdFaults = *chaos
	code := m.Run()
	testkit.RemoveBuilds()
	if len(results) > 0 {
		var b strings.Builder
		writeTable(&b, results)
		writeLoadTable(&b, results)
		os.Stdout.WriteString("\n" + b.String())
		if *reportPath != "" {
			f, err := os.OpenFile(*reportPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			if err == nil {
				_, _ = f.WriteString(b.String())
				f.Close()
			}
		}
	}
	os.Exit(code)
}

// TestFaults runs each scenario against our server and the upstream-wired
// one. Against ours it asserts the targets: every invariant holds,
// no client re-lists, no stream ends (except, closed, when our own server
// restarts), and a write after the heal reaches every open stream. Against
// upstream it only reports, for the comparison table: its behaviour is
// not ours to assert.
func TestFaults(t *testing.T) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, true)
	if *soakFor > 0 {
		runSoak(t)
		return
	}
	known := map[string]bool{}
	for _, sc := range scenarios {
		known[sc.name] = true
	}
	for name := range shortScenarios {
		if !known[name] {
			t.Fatalf("shortScenarios names %q, which is no scenario: make test would not run it against upstream", name)
		}
	}
	for _, sc := range scenarios {
		if sc.long && !*chaos {
			continue // make chaos runs it
		}
		impls := []string{ours, upstream}
		if !*chaos && !shortScenarios[sc.name] {
			impls = []string{ours}
		}
		storms := map[string]*stormResult{}
		seed := newSeed()
		for _, impl := range impls {
			t.Run(sc.name+"/"+impl, func(t *testing.T) { storms[impl] = runScenario(t, sc, impl, seed).storm })
		}
		if msg := stormSlower(storms[ours], storms[upstream]); msg != "" {
			t.Errorf("%s: %s", sc.name, msg)
		}
	}
}

// stormTolerance is how much longer than upstream's, in the same run, ours
// may take to resume every watch of the reconnect storm. Issue 28 asked for
// 5 s. On the shared 2-core machine the storm is CPU-bound, with the
// 5,000 streams' client in the test process, and its time follows the
// machine: 2.4 s for ours on 2026-11-25, 7.6–10.4 s on 2026-11-26, when the
// code of 2026-11-25 took 9.6 and 10.0 s and upstream 7.1–10.4 s
// (docs/reliability.md). Runs of one server minutes apart vary by about
// 20%, so the bound is upstream's time plus a quarter.
const stormTolerance = 1.25

// stormSlower says how ours' storm was slower than upstream's beyond
// stormTolerance, or "" if it was not, or if either did not run.
func stormSlower(o, u *stormResult) string {
	if o == nil || u == nil || o.resumed <= time.Duration(float64(u.resumed)*stormTolerance) {
		return ""
	}
	return fmt.Sprintf("ours resumed every watch in %v, upstream in %v: want within %.2f× of upstream's in the same run",
		o.resumed.Round(time.Millisecond), u.resumed.Round(time.Millisecond), stormTolerance)
}

// runScenario runs sc against impl, records its row of the table, fails on
// what the harness could not measure, and, against ours, asserts the
// issue's targets.
func runScenario(t *testing.T, sc scenario, impl string, seed uint64) *result {
	t.Logf("seed %d: replay with go test ./test/faults -run 'TestFaults/%s/%s' -args -seed %d", seed, sc.name, impl, seed)
	r := run(t, sc, impl, "", seed)
	record(r)
	for _, h := range r.harnessErrors {
		t.Errorf("harness: %s", h)
	}
	if impl == ours {
		assertOurs(t, sc, r)
	}
	return r
}

// runSoak is make soak: one long run over a 3-member cluster behind client
// and peer proxies, faults drawn from soakFaults at random times from a
// seed, against ours, and against upstream too with -chaos. Against ours
// it asserts what every scenario does, and that the server's goroutines,
// open file descriptors and heap end within 10% of where they began.
func runSoak(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("soak seed %d: go test ./test/faults -run TestFaults -v -args -soak %v -seed %d", seed, *soakFor, seed)
	sc := scenario{name: "chaos soak", members: 3, serverMembers: []int{0, 1, 2}, peerProxies: true,
		etcdArgs: []string{"--quota-backend-bytes", strconv.Itoa(soakQuota)}, fault: soak(seed, *soakFor)}
	impls := []string{ours}
	if *chaos {
		impls = append(impls, upstream)
	}
	for _, impl := range impls {
		t.Run(sc.name+"/"+impl, func(t *testing.T) {
			r := runScenario(t, sc, impl, seed)
			if impl != ours {
				return
			}
			if r.soak == nil {
				t.Fatal("the soak recorded nothing")
			}
			for _, l := range r.soak.leaks() {
				t.Errorf("after the soak (seed %d): %s, want within %.0f%%", seed, l, 100*leakTolerance)
			}
		})
	}
}

// stormBound is how soon every watch of the reconnect storm must resume
// on the survivor, whatever upstream's time: 3 times the slowest run seen.
const stormBound = 30 * time.Second

// sigtermRecoveryBound is how soon after a SIGTERMed server is back, or
// its replicas are, every stream must have resumed.
const sigtermRecoveryBound = 2 * time.Second

// readyBound is how soon after the heal our server's /readyz must answer 200.
const readyBound = 10 * time.Second

func assertOurs(t *testing.T, sc scenario, r *result) {
	t.Helper()
	if n := r.Total(); n > 0 {
		t.Errorf("%d invariant violations: %v", n, r.Violations)
	}
	if r.undelivered > 0 {
		t.Errorf("%d sentinels written after the heal never reached their streams", r.undelivered)
	}
	if r.checksFailed > 0 {
		t.Errorf("the cache's consistency check failed %d times", r.checksFailed)
	}
	if r.ended410 > 0 {
		t.Errorf("%d streams ended with 410, want none", r.ended410)
	}
	// A stream that went back to a resourceVersion etcd compacted away
	// re-lists after its 410: etcd's answer. Nothing else may re-list.
	if r.relists > r.compacted410 && !sc.compacts && !r.compactedUnder {
		t.Errorf("clients re-listed %d times, %d of them after etcd compacted what they held; want only those",
			r.relists, r.compacted410)
	}
	if r.writesStalled {
		t.Errorf("writes did not resume within %v of the heal", resumeBound)
	}
	if r.readyAgain > readyBound {
		t.Errorf("/readyz answered 200 %v after the heal, want within %v", r.readyAgain, readyBound)
	}
	// The reconnect storm against upstream's time is TestFaults's
	// (stormSlower); this bound catches a storm that never ends. Issue 28's
	// other bound, the survivor's writes' p99 within 3× of before, is
	// reported and not asserted: with the 5,000 streams' client on the same
	// two cores, both servers' writes wait for the harness
	// (docs/reliability.md).
	if m := r.storm; m != nil && m.resumed > stormBound {
		t.Errorf("the watches took %v to resume on the survivor, want within %v", m.resumed, stormBound)
	}
	if m := r.silent; m != nil {
		if m.deliveredAgain == 0 || m.deliveredAgain > silentBound {
			t.Errorf("the streams got events again %v after member %d went silent, want within %v (0: not before the heal)",
				m.deliveredAgain, m.member+1, silentBound)
		}
		if m.failedAfter > 0 {
			t.Errorf("%d of %d writes failed after the streams recovered from the silent member, want none: requests must move off it with the watch",
				m.failedAfter, m.writesAfter)
		}
	}
	// The shutdown bookmark's wiring: every watch that asked for bookmarks
	// gets one before the server closes it, so none closes empty.
	if sc.sigterm && r.closedEmpty > 0 {
		t.Errorf("%d watch connections asking for bookmarks closed having delivered nothing (of %d closed)", r.closedEmpty, r.endedClosed)
	}
	// A re-watch that reaches the stopping server is told to retry after
	// 1 s (apiserver.WithShutdownRetryAfter); with upstream's 5 s, recovery
	// took 3.4–3.8 s.
	if sc.sigterm && r.recovery > sigtermRecoveryBound {
		t.Errorf("events flowed again %v after the restart, want within %v", r.recovery, sigtermRecoveryBound)
	}
	if sc.serverGoes {
		return
	}
	if r.staleReadErrors > 0 {
		t.Errorf("%d lists at resourceVersion 0 failed; the cache must serve them through any etcd fault", r.staleReadErrors)
	}
	if r.unclearErrors > 0 {
		t.Errorf("%d consistent lists failed with a code other than 429, 503 or 504", r.unclearErrors)
	}
	// The bound: events flow again within 5 s of the heal.
	if r.recovery > 5*time.Second {
		t.Errorf("events flowed again %v after the heal, want within 5s", r.recovery)
	}
	if ended := r.endedError + r.endedClosed; ended > 0 {
		t.Errorf("%d streams ended (error: %d, closed: %d), want none", ended, r.endedError, r.endedClosed)
	}
	if r.cacheRelists > 0 {
		t.Errorf("the cache re-listed etcd %d times, want none", r.cacheRelists)
	}
}

// TestInjectedFaultsAreCaught proves the harness can fail: a build of our
// server with the faultinject tag breaks one promise in its cache's
// watches, and the matching invariant must catch it.
func TestInjectedFaultsAreCaught(t *testing.T) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, true)
	tests := []struct {
		fault    string
		scenario string
		counter  func(*result) int
		// short runs it in make test; make chaos runs every one.
		short bool
		// load, if set, restarts the server over that many more agents
		// (restartOverLoadedCompacted) in place of the scenario's fault.
		load int
		// modify, if set, changes the scenario for the fault.
		modify func(*scenario)
	}{
		{fault: "drop", scenario: "baseline", counter: func(r *result) int { return r.Reliable }, short: true},
		{fault: "duplicate", scenario: "baseline", counter: func(r *result) int { return r.Unique }},
		{fault: "reorder", scenario: "baseline", counter: func(r *result) int { return r.Ordered }},
		{fault: "early-bookmark", scenario: "baseline", counter: func(r *result) int { return r.Bookmarkable }},
		// Issue 56's: a revision's last event dropped, a list missing one
		// of its revision's events, the history's floor moved by progress,
		// and /readyz without the caches.
		{fault: string(inject.DropLastOfRevision), scenario: "baseline", counter: func(r *result) int { return r.Atomic + r.Reliable }},
		{fault: string(inject.ListMissesRevisionEvent), scenario: "baseline", counter: func(r *result) int { return r.Lists }},
		{fault: string(inject.FloorOnProgress), scenario: "server restart over a compacted etcd",
			counter: func(r *result) int { return r.ended410 + r.Resumable }},
		// Over 20,000 agents, so that the caches' first lists take long
		// enough after the restart for /readyz to answer before them: over
		// the scenario's hundred objects they list within its first poll.
		{fault: string(inject.ReadyzWithoutCache), scenario: "server restart over a compacted etcd",
			counter: func(r *result) int { return r.Readiness }, short: true, load: 20_000},
		// Issue 65's: the backfill gives up on etcd paused inside it, at a
		// random moment of it; a watch from before the restart then gets
		// 410 though etcd holds its history.
		{fault: string(inject.BackfillGivesUp), scenario: "random moment", modify: pausedInsideBackfill,
			counter: func(r *result) int { return r.Liveness + r.Resumable }},
	}
	for _, tc := range tests {
		if !*chaos && !tc.short {
			continue
		}
		t.Run(tc.fault, func(t *testing.T) {
			sc := scenarioNamed(tc.scenario)
			if tc.load > 0 {
				sc.fault = restartOverLoadedCompacted(tc.load)
			}
			if tc.modify != nil {
				tc.modify(&sc)
			}
			r := run(t, sc, ours, tc.fault, newSeed())
			record(r)
			for _, h := range r.harnessErrors {
				t.Errorf("harness: %s", h)
			}
			if tc.counter(r) == 0 {
				t.Errorf("the harness did not catch an injected %s: %s", tc.fault, r.summary())
			}
		})
	}
}

// backfillListFailpoint holds each of a start's first four list pages
// for 3 s after etcd answered them: the caches' first lists, then their
// backfills' lists, at /readyz, so that each backfill opens its replay's
// watch 3 s after /readyz. The harness's history is one page and one
// watch response long, which etcd sends at once: held at the response
// instead (replayFailpoint), the replay would need nothing more of etcd.
const backfillListFailpoint = "list-page-after=sleep(3s)*4"

// pausedInsideBackfill makes the random moment's fault a pause of the
// server's member for etcdPause, longer than the cache takes to find a
// watch silent, at a moment drawn inside the restarted server's backfill,
// which backfillListFailpoint holds open.
func pausedInsideBackfill(sc *scenario) {
	sc.fault = randomMoment(momentFault{window: insideBackfill, kind: memberPaused, length: etcdPause})
	sc.failpoints = backfillListFailpoint
}

// TestStormSlower checks the storm's bound against upstream: within a
// quarter more passes, beyond it fails, and a side that did not run
// passes.
func TestStormSlower(t *testing.T) {
	storm := func(d time.Duration) *stormResult { return &stormResult{resumed: d} }
	tests := []struct {
		name     string
		ours, up *stormResult
		slower   bool
	}{
		{"faster", storm(7 * time.Second), storm(9 * time.Second), false},
		{"a quarter slower", storm(10 * time.Second), storm(8 * time.Second), false},
		{"a third slower", storm(12 * time.Second), storm(9 * time.Second), true},
		{"upstream did not run", storm(30 * time.Second), nil, false},
		{"ours did not run", nil, storm(time.Second), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := stormSlower(tc.ours, tc.up); (got != "") != tc.slower {
				t.Errorf("stormSlower() = %q, want slower: %v", got, tc.slower)
			}
		})
	}
}
