//go:build faultinject

package cacher

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
)

// TestRobustnessFailpoints puts faults inside the cache's own transitions
// (issue 65): each run takes the transitions profile's traffic (restarts,
// compactions, transactions, an idle resource) and arms one to three of
// the cache's failpoints, chosen from the seed, at a moment drawn from the
// traffic's length, each sleeping (1 ms–30 s), failing, ending or stalling
// the etcd watch, or repeating a response. When the traffic ends every
// failpoint is disarmed and every guarantee is checked, safety and
// liveness. ROBUSTNESS_FAILPOINT_SEEDS (2) runs; make robustness runs 200.
// ROBUSTNESS_SEED replays one.
func TestRobustnessFailpoints(t *testing.T) {
	n := envInt("ROBUSTNESS_FAILPOINT_SEEDS", 2)
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = rand.Uint64() >> 1
	}
	if rbSeed != 0 {
		seeds = []uint64{rbSeed}
	}
	var results []rbResult
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			plan := newFailpointPlan(seed, rbFor)
			t.Logf("replay: ROBUSTNESS_SEED=%d go test -tags faultinject ./pkg/storage/cacher -run 'TestRobustnessFailpoints$'; failpoints: %s",
				seed, plan)
			got := runRobustnessWith(t, rbTransitions, seed, plan.options())
			results = append(results, got...)
			for _, r := range got {
				t.Logf("%s: %v", r.impl, r.Violations)
				if r.impl == rbOurs && r.Total() > 0 {
					t.Errorf("ours broke %d guarantees (seed %d, failpoints %s): %v\n%s", r.Total(), seed, plan, r.Violations,
						strings.Join(r.Details, "\n"))
				}
			}
		})
	}
	t.Log("\n" + rbTable(results))
}

// rbTransitions is the traffic of failpoint runs: every transition the
// cache has, often.
var rbTransitions = rbProfileSpec{name: "transitions", weights: weights(int(opCreate), 3, int(opUpdate), 2, int(opDelete), 1,
	int(opTxn), 2, int(opLease), 1, int(opIdle), 1, int(opIdleWrite), 1, int(opCompact), 1, int(opRestart), 2)}

// failpointKinds are the actions each failpoint can take.
var failpointKinds = map[inject.Point][]inject.Kind{
	inject.ListPageBefore:   {inject.Sleep, inject.Fail},
	inject.ListPageAfter:    {inject.Sleep, inject.Fail},
	inject.ListToWatch:      {inject.Sleep},
	inject.Relist:           {inject.Sleep},
	inject.Replay:           {inject.Sleep, inject.Fail, inject.EndWatch, inject.Repeat, inject.Stall},
	inject.BackfillPrepend:  {inject.Sleep, inject.Fail},
	inject.ApplyAppend:      {inject.Sleep},
	inject.ConsistencyCheck: {inject.Sleep, inject.Fail, inject.Mismatch},
	inject.SilenceCheck:     {inject.Fail, inject.EndWatch},
	inject.WatchResponse:    {inject.Fail, inject.EndWatch, inject.Repeat, inject.Stall},
	inject.OutageEnd:        {inject.Sleep},
	inject.WatchOpen:        {inject.Stall},
}

// armed is one failpoint of a plan: armed at, after the traffic starts.
type armed struct {
	point  inject.Point
	action inject.Action
	at     time.Duration
}

// failpointPlan is the failpoints of one run.
type failpointPlan []armed

// newFailpointPlan draws one to three failpoints from seed, armed within
// traffic.
func newFailpointPlan(seed uint64, traffic time.Duration) failpointPlan {
	rnd := rand.New(rand.NewPCG(seed, 0xfa11))
	var plan failpointPlan
	for range 1 + rnd.IntN(3) {
		p := inject.Points[rnd.IntN(len(inject.Points))]
		kinds := failpointKinds[p]
		a := inject.Action{Kind: kinds[rnd.IntN(len(kinds))]}
		if a.Kind == inject.Sleep {
			// Log-uniform in [1 ms, 30 s].
			a.Sleep = time.Duration(math.Exp(math.Log(float64(time.Millisecond)) +
				rnd.Float64()*(math.Log(float64(30*time.Second))-math.Log(float64(time.Millisecond)))))
		}
		if rnd.IntN(2) == 0 {
			a.Prob = 0.05 + 0.95*rnd.Float64()
		}
		if rnd.IntN(2) == 0 {
			a.Count = 1 + rnd.IntN(5)
		}
		plan = append(plan, armed{point: p, action: a, at: time.Duration(rnd.Int64N(int64(traffic)))})
	}
	slices.SortFunc(plan, func(a, b armed) int { return cmp.Compare(a.at, b.at) })
	return plan
}

func (p failpointPlan) String() string {
	var out []string
	for _, a := range p {
		s := fmt.Sprintf("%s=%s", a.point, a.action.Kind)
		if a.action.Kind == inject.Sleep {
			s += fmt.Sprintf("(%v)", a.action.Sleep.Round(time.Millisecond))
		}
		if a.action.Prob > 0 {
			s += fmt.Sprintf("@%.2f", a.action.Prob)
		}
		if a.action.Count > 0 {
			s += fmt.Sprintf("*%d", a.action.Count)
		}
		out = append(out, s+fmt.Sprintf(" at +%v", a.at.Round(time.Millisecond)))
	}
	return strings.Join(out, ", ")
}

// options arms the plan's failpoints at their moments, and disarms them
// all when the traffic ends. The consistency check and the silence check
// run every second, so that their failpoints meet the traffic.
func (p failpointPlan) options() rbOptions {
	return rbOptions{
		config: func(c *Config) {
			c.ConsistencyCheckInterval = time.Second
			c.ProgressRequestInterval = time.Second
		},
		faults: func(ctx context.Context) {
			start := time.Now()
			for _, a := range p {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(start.Add(a.at))):
				}
				inject.Arm(a.point, a.action)
			}
		},
		disarm: inject.DisarmAll,
		// Armed is enough: a later arm of the same point resets what
		// inject.Fired counts.
		relistedCold: func() bool {
			return slices.ContainsFunc(p, func(a armed) bool { return a.action.Kind == inject.Mismatch })
		},
	}
}
