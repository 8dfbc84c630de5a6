package faults

import (
	"flag"
	"testing"

	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
)

var (
	chaosLoad     = flag.Bool("chaos-load", false, "run every fault under load against both servers, at -load.streams (make chaos-load)")
	loadObjects   = flag.Int("load.streams", fullLoad.objects, "single-object streams, and objects, of -chaos-load's runs")
	loadInject    = flag.String("load.inject", "", "run the load against ours with this fault injected (the faultinject build): the run must catch it")
	momentObjects = flag.Int("load.moment-streams", randomMomentStreams, "single-object streams of -chaos-load's random moment, at most -load.streams")
)

// loadFaults are the scenarios -chaos-load runs under load, both servers.
var loadFaults = []string{"kill-9 single member", "leader loss", "blackhole 15s", "server restart", "random moment"}

// proxied are the faults of loadFaults that need the proxy between the
// server and etcd; the others run without it (scenario.direct). The random
// moment goes through it as in TestFaults.
var proxied = map[string]bool{"blackhole 15s": true, "random moment": true}

// randomMomentStreams caps the single-object streams of the random
// moment under load. Its two restarts with an etcd fault inside the
// second start do not fit 20,000 streams on two cores: the streams' 429
// retries (Retry-After 1 s, which client-go retries ten times a watch),
// the server, etcd and the test's own clients saturate both cores for
// minutes. At 20,000, ours' first start under them did not end its
// backfills within the scenario's minute, and in another run served no
// stream within 2 minutes of the heal; at 10,000 it served them 90 s
// after the heal; at 5,000 it passes (2026-11-29, shared 2 cores).
const randomMomentStreams = 5_000

// ciLoadFault is the one make test runs under ciLoad, against ours.
const ciLoadFault = "kill-9 single member"

// TestUnderLoad runs faults under load (issue 65, item 5): by default
// make test's subset, one fault against ours at ciLoad; with -chaos-load
// every fault of loadFaults against both servers at -load.streams. Against
// ours it asserts no violation, no client re-list (etcd compacts nothing
// here), every stream recovered, and RSS after recovery within
// rssTolerance of before. Upstream's runs are reported only.
func TestUnderLoad(t *testing.T) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, true)
	cfg, faults, impls := ciLoad, []string{ciLoadFault}, []string{ours}
	if *chaosLoad {
		cfg, faults, impls = fullLoad, loadFaults, []string{ours, upstream}
		cfg.objects = *loadObjects
	}
	if *loadInject != "" {
		impls = []string{ours}
	}
	for _, name := range faults {
		sc := scenarioNamed(name)
		sc.direct = !proxied[name]
		if name == "server restart" {
			sc.fault = restartUnderLoad
		}
		cfg := cfg
		if name == "random moment" {
			cfg.objects = min(cfg.objects, *momentObjects)
			// Not at a re-list: its compaction makes every client
			// re-list, which is not what the load measures. At 5,000
			// streams that was 5,110 re-lists, every stream back within
			// 15 s and the RSS 1.27× after; at 20,000 the re-lists and
			// their 429s kept the cache from listing for minutes on two
			// cores (2026-11-29, seeds 28 and 8844087501864462877).
			sc.fault = randomMoment(momentFault{noRelist: true})
		}
		seed := newSeed()
		for _, impl := range impls {
			t.Run(name+"/"+impl, func(t *testing.T) {
				t.Logf("seed %d: replay with go test ./test/faults -run 'TestUnderLoad/%s/%s' -args -seed %d", seed, name, impl, seed)
				r := runLoad(t, sc, cfg, impl, *loadInject, seed)
				record(r)
				for _, h := range r.harnessErrors {
					t.Errorf("harness: %s", h)
				}
				switch {
				case *loadInject != "":
					if r.Total() == 0 {
						t.Errorf("the load did not catch an injected %s: %s", *loadInject, r.summary())
					}
				case impl == ours:
					assertLoad(t, sc, r)
				}
			})
		}
	}
}

// assertLoad holds ours to the targets under load.
func assertLoad(t *testing.T, sc scenario, r *result) {
	t.Helper()
	if n := r.Total(); n > 0 {
		t.Errorf("%d invariant violations: %v", n, r.Violations)
	}
	if r.relists > r.compacted410 && !sc.compacts && !r.compactedUnder {
		t.Errorf("clients re-listed %d times, %d of them after etcd compacted what they held; want only those",
			r.relists, r.compacted410)
	}
	if r.ended410 > 0 {
		t.Errorf("%d streams ended with 410, want none", r.ended410)
	}
	if l := r.load; l.unrecovered > 0 {
		t.Errorf("%d of %d streams received no write made after the heal within %v", l.unrecovered, l.streams, loadRecoveryDeadline)
	}
	if l := r.load; l.rssRatio() > rssTolerance {
		t.Errorf("the server's RSS after recovery is %d MiB, %.2f× the %d MiB before the fault, want within %.1f×",
			l.rssAfter>>20, l.rssRatio(), l.rssBefore>>20, rssTolerance)
	}
	if r.writesStalled {
		t.Errorf("writes did not resume within %v of the heal", resumeBound)
	}
}
