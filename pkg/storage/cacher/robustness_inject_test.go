//go:build faultinject

package cacher

import (
	"strings"
	"testing"
	"time"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// TestRobustnessCatchesInjectedBugs shows that the robustness runs can
// fail: with each bug of issues 56 and 65 put back into our cache, a run of
// the profile that meets it, with the failpoints that bring it out where
// the bug lies in a transition, must count it under its guarantee, within
// the seeds given. make test runs it in the faultinject build.
func TestRobustnessCatchesInjectedBugs(t *testing.T) {
	total := func(v watchcheck.Violations) int { return v.Total() }
	catchInjected(t, []catchCase{
		{fault: inject.DropLastOfRevision, profile: profileNamed("transactions"),
			caught: func(v watchcheck.Violations) int { return v.Atomic + v.Reliable }},
		{fault: inject.FloorOnProgress, profile: profileNamed("idle"),
			caught: func(v watchcheck.Violations) int { return v.Resumable }},
		{fault: "early-bookmark", profile: profileNamed("transactions"),
			caught: func(v watchcheck.Violations) int { return v.Bookmarkable }},
		{fault: inject.ListMissesRevisionEvent, profile: profileNamed("transactions"),
			caught: func(v watchcheck.Violations) int { return v.Lists }},
		// Issue 65: each in the transitions' traffic, with the failpoint
		// that puts a fault where the bug is.
		{fault: inject.BackfillGivesUp, profile: rbTransitions,
			plan:   failpointPlan{{point: inject.Replay, action: inject.Action{Kind: inject.Fail}}},
			caught: func(v watchcheck.Violations) int { return v.Resumable + v.Liveness }},
		{fault: inject.FailedListCold, profile: rbTransitions,
			plan:   failpointPlan{{point: inject.ListPageBefore, action: inject.Action{Kind: inject.Fail, Prob: 0.5}}},
			caught: func(v watchcheck.Violations) int { return v.Resumable + v.Liveness }},
		// Without restarts, which replace the cache the lists read.
		{fault: inject.ExactListUnlocked, profile: profileNamed("transactions"),
			// Short enough that the dispatcher keeps up with the writes:
			// at 40 ms it fell behind, consistent lists waited out their
			// 3 s, and the listers made few exact lists (1 run in 4
			// caught it; at 5 ms every run, 4–6 lists each).
			plan:   failpointPlan{{point: inject.ApplyAppend, action: inject.Action{Kind: inject.Sleep, Sleep: 5 * time.Millisecond}}},
			caught: func(v watchcheck.Violations) int { return v.Lists }},
		{fault: inject.ReplayKeepsRepeats, profile: rbTransitions,
			plan:   failpointPlan{{point: inject.Replay, action: inject.Action{Kind: inject.Repeat}}},
			caught: total},
	})
}

// TestRobustnessCatchesStuckCaches is TestRobustnessCatchesInjectedBugs
// for the bugs that leave a cache stuck, which only the liveness check
// catches, once its wait has passed: 20–30 s each. make robustness runs
// it; make test runs the others.
func TestRobustnessCatchesStuckCaches(t *testing.T) {
	catchInjected(t, []catchCase{
		// A backfill held open by a slow replay, and a consistency check
		// that finds a difference: the cold re-list abandons the backfill,
		// and watches from below its end must not wait on it for good.
		{fault: inject.BackfillKept, profile: rbTransitions,
			plan: failpointPlan{
				{point: inject.Replay, action: inject.Action{Kind: inject.Sleep, Sleep: 300 * time.Millisecond}},
				{point: inject.ConsistencyCheck, action: inject.Action{Kind: inject.Mismatch, Prob: 0.5}}},
			// Checks often enough to meet a backfill: a restart every
			// second or so replaces the cache and its check timer.
			config: func(c *Config) { c.ConsistencyCheckInterval = 100 * time.Millisecond },
			caught: func(v watchcheck.Violations) int { return v.Liveness }},
		{fault: inject.BackfillIdleByHead, profile: rbTransitions,
			plan:   failpointPlan{{point: inject.Replay, action: inject.Action{Kind: inject.Stall}}},
			caught: func(v watchcheck.Violations) int { return v.Liveness }},
		// The follower's watch ends, and the one that replaces it opens on
		// a member that never answers; no restart replaces the cache.
		{fault: inject.WatchWaitsCreated, profile: profileNamed("transactions"),
			plan: failpointPlan{
				{point: inject.WatchOpen, action: inject.Action{Kind: inject.Stall, Count: 1}, at: time.Second},
				{point: inject.WatchResponse, action: inject.Action{Kind: inject.EndWatch, Count: 1}, at: time.Second}},
			caught: func(v watchcheck.Violations) int { return v.Reliable + v.Liveness }},
	})
}

// catchCase is a bug put back, the traffic and failpoints that bring it
// out, and the guarantees under which the runs must count it.
type catchCase struct {
	fault   inject.Fault
	profile rbProfileSpec
	plan    failpointPlan
	// config, if set, changes ours' Config after the plan's options.
	config func(*Config)
	seeds  []uint64
	caught func(watchcheck.Violations) int
}

// catchInjected runs each case with its bug put back, and fails unless
// its runs count it.
func catchInjected(t *testing.T, tests []catchCase) {
	t.Helper()
	// ROBUSTNESS_CATCH_CONTROL=1 runs each case without its bug instead,
	// and requires no violation: what catches a bug is not the failpoints
	// alone.
	control := envInt("ROBUSTNESS_CATCH_CONTROL", 0) == 1
	for _, tc := range tests {
		t.Run(string(tc.fault), func(t *testing.T) {
			if !control {
				defer inject.Set(tc.fault)()
			}
			defer inject.DisarmAll()
			seeds := tc.seeds
			if len(seeds) == 0 {
				// A second seed only where the first did not catch it.
				seeds = []uint64{1, 2}
			}
			var missed []string
			for _, seed := range seeds {
				opts := rbOptions{}
				if tc.plan != nil {
					opts = tc.plan.options()
				}
				if tc.config != nil {
					planConfig := opts.config
					opts.config = func(c *Config) {
						if planConfig != nil {
							planConfig(c)
						}
						tc.config(c)
					}
				}
				for _, r := range runRobustnessWith(t, tc.profile, seed, opts) {
					if r.impl != rbOurs {
						continue
					}
					t.Logf("ours with %s, seed %d: %v\n%s", tc.fault, seed, r.Violations, strings.Join(r.Details[:min(5, len(r.Details))], "\n"))
					if control {
						if r.Total() > 0 {
							t.Errorf("without %s, seed %d: %v", tc.fault, seed, r.Violations)
						}
						continue
					}
					if tc.caught(r.Violations) > 0 {
						return
					}
					missed = append(missed, r.Violations.String())
				}
			}
			if !control {
				t.Errorf("the runs (%s, seeds %v, failpoints %s) did not catch %s:\n%s", tc.profile.name, seeds, tc.plan, tc.fault,
					strings.Join(missed, "\n"))
			}
		})
	}
}

// profileNamed returns the robustness profile called name.
func profileNamed(name string) rbProfileSpec {
	for _, p := range rbProfiles {
		if p.name == name {
			return p
		}
	}
	panic("no robustness profile " + name)
}
