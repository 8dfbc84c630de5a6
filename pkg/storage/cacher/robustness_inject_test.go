//go:build faultinject

package cacher

import (
	"strings"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// TestRobustnessCatchesInjectedBugs shows that the robustness runs can
// fail: with each bug of issue 56 put back into our cache, a run of the
// profile that meets it must count it under its guarantee. make test runs
// it in the faultinject build.
func TestRobustnessCatchesInjectedBugs(t *testing.T) {
	tests := []struct {
		fault   inject.Fault
		profile string
		caught  func(watchcheck.Violations) int
	}{
		{fault: inject.DropLastOfRevision, profile: "transactions",
			caught: func(v watchcheck.Violations) int { return v.Atomic + v.Reliable }},
		{fault: inject.FloorOnProgress, profile: "idle",
			caught: func(v watchcheck.Violations) int { return v.Resumable }},
		{fault: "early-bookmark", profile: "transactions",
			caught: func(v watchcheck.Violations) int { return v.Bookmarkable }},
		{fault: inject.ListMissesRevisionEvent, profile: "transactions",
			caught: func(v watchcheck.Violations) int { return v.Lists }},
	}
	for _, tc := range tests {
		t.Run(string(tc.fault), func(t *testing.T) {
			defer inject.Set(tc.fault)()
			var profile rbProfileSpec
			for _, p := range rbProfiles {
				if p.name == tc.profile {
					profile = p
				}
			}
			const seed = 1
			for _, r := range runRobustness(t, profile, seed) {
				if r.impl != rbOurs {
					continue
				}
				t.Logf("ours with %s: %v\n%s", tc.fault, r.Violations, strings.Join(r.Details[:min(5, len(r.Details))], "\n"))
				if tc.caught(r.Violations) == 0 {
					t.Errorf("the run (%s, seed %d) did not catch %s: %v\n%s", tc.profile, seed, tc.fault, r.Violations,
						strings.Join(r.Details, "\n"))
				}
			}
		})
	}
}
