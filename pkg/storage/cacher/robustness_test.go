package cacher

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// TestRobustness drives our cache and upstream's, side by side over one
// etcd, with randomized traffic of the shapes the HTTP suite cannot make
// (objects on leases, written through the etcd3 store or beside it) and
// those it can (transactions over many keys, an idle resource beside a
// busy one, compactions, restarts), with clients at every speed that go
// back to any resourceVersion they were handed. Every stream and list is
// checked against etcd's own history (internal/watchcheck). Ours must
// break no guarantee; upstream's violations are reported beside.
//
// Each run prints its seed. The environment picks the runs, so that one
// go test of every package can set them: ROBUSTNESS_SEEDS (2) seeds of
// each profile, make robustness 20; ROBUSTNESS_SEED replays one seed,
// ROBUSTNESS_PROFILE one profile, and ROBUSTNESS_TRAFFIC (6s) is how long
// each run writes.
var (
	rbSeeds   = envInt("ROBUSTNESS_SEEDS", 2)
	rbSeed    = uint64(envInt("ROBUSTNESS_SEED", 0))
	rbProfile = os.Getenv("ROBUSTNESS_PROFILE")
	rbFor     = envDuration("ROBUSTNESS_TRAFFIC", 6*time.Second)
)

func envInt(name string, def int) int {
	if v, err := strconv.ParseUint(os.Getenv(name), 10, 64); err == nil {
		return int(v)
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

// rbProfileSpec is one shape of traffic: its first steps, and the weights
// of the others.
type rbProfileSpec struct {
	name    string
	prelude []rbOp
	weights [numOps]int
}

func weights(pairs ...int) [numOps]int {
	var w [numOps]int
	for i := 0; i+1 < len(pairs); i += 2 {
		w[pairs[i]] = pairs[i+1]
	}
	return w
}

var rbProfiles = []rbProfileSpec{
	{name: "transactions", weights: weights(int(opCreate), 3, int(opUpdate), 3, int(opDelete), 2, int(opTxn), 4, int(opIdleWrite), 1)},
	{name: "leases", weights: weights(int(opCreate), 2, int(opUpdate), 2, int(opLease), 3, int(opStoreTTL), 2, int(opTxn), 1)},
	// The idle resource restarted over a compacted etcd, so that its
	// history cannot fill, then hearing only progress while the other is
	// written: issue 56's 410 for a resourceVersion it handed out.
	{name: "idle", prelude: []rbOp{opCompact, opRestartIdle}, weights: weights(int(opIdle), 3, int(opCreate), 2, int(opUpdate), 1)},
	{name: "idle and written", weights: weights(int(opIdle), 3, int(opCreate), 2, int(opIdleWrite), 1, int(opCompact), 1)},
	{name: "restarts over a compacted etcd", weights: weights(int(opCreate), 3, int(opUpdate), 2, int(opDelete), 1, int(opTxn), 2,
		int(opLease), 1, int(opCompact), 1, int(opRestart), 1)},
	{name: "mixed", weights: weights(int(opCreate), 3, int(opUpdate), 3, int(opDelete), 2, int(opTxn), 2, int(opLease), 2,
		int(opStoreTTL), 1, int(opIdle), 1, int(opIdleWrite), 1, int(opCompact), 1, int(opRestart), 1)},
}

// rbResult is what one implementation broke in one run.
type rbResult struct {
	profile string
	seed    uint64
	impl    string
	watchcheck.Violations
}

func TestRobustness(t *testing.T) {
	var results []rbResult
	for _, p := range rbProfiles {
		if rbProfile != "" && p.name != rbProfile {
			continue
		}
		seeds := make([]uint64, rbSeeds)
		for i := range seeds {
			seeds[i] = rand.Uint64() >> 1
		}
		if rbSeed != 0 {
			seeds = []uint64{rbSeed}
		}
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/%d", p.name, seed), func(t *testing.T) {
				t.Logf("replay: ROBUSTNESS_PROFILE='%s' ROBUSTNESS_SEED=%d go test ./pkg/storage/cacher -run 'TestRobustness$'", p.name, seed)
				got := runRobustness(t, p, seed)
				results = append(results, got...)
				for _, r := range got {
					t.Logf("%s: %v", r.impl, r.Violations)
					if r.impl != rbOurs && r.Total() > 0 {
						t.Logf("%s's first violations:\n%s", r.impl, strings.Join(r.Details[:min(len(r.Details), 5)], "\n"))
					}
					if r.impl == rbOurs && r.Total() > 0 {
						t.Errorf("ours broke %d guarantees (seed %d): %v\n%s", r.Total(), seed, r.Violations, strings.Join(r.Details, "\n"))
					}
				}
			})
		}
	}
	t.Log("\n" + rbTable(results))
}

// rbOptions change a run.
type rbOptions struct {
	// config changes ours' Config.
	config func(*Config)
	// faults, if set, runs beside the traffic, from its start until ctx
	// ends; disarm ends the faults when the traffic does, before the
	// liveness probe.
	faults func(ctx context.Context)
	disarm func()
	// relistedCold, if set, reports whether the faults made ours' caches
	// re-list cold (rbCache.lostHistorySince).
	relistedCold func() bool
}

// runRobustness runs one profile from seed against every implementation
// and checks what each handed out.
func runRobustness(t *testing.T, p rbProfileSpec, seed uint64) []rbResult {
	return runRobustnessWith(t, p, seed, rbOptions{})
}

// runRobustnessWith is runRobustness with opts.
func runRobustnessWith(t *testing.T, p rbProfileSpec, seed uint64, opts rbOptions) []rbResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := newRBEnv(t, opts.config)
	for _, r := range env.resources {
		r.caches[rbOurs].relistedCold = opts.relistedCold
	}
	env.followTruth(ctx, t)
	env.waitReady(t)
	w := newRBWriter(env, seed, p)
	// Some history before the clients start, so that the first lists
	// hold objects.
	for range 20 {
		if err := w.create(ctx, env.resources[0], 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.create(ctx, env.resources[1], 0); err != nil {
		t.Fatal(err)
	}

	rnd := rand.New(rand.NewPCG(seed, 1))
	clientCtx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	var wg sync.WaitGroup
	var settled atomic.Bool
	clients := map[string][]*rbClient{}
	listers := map[string][]*rbLister{}
	for _, r := range env.resources {
		n := 12
		if r.name == "idle" {
			n = 4
		}
		for _, impl := range rbImpls {
			var mine []*rbClient
			for i := range n {
				c := &rbClient{name: fmt.Sprintf("%s/%s/%d", impl, r.name, i), res: r, cache: r.caches[impl],
					sel: rbSelectors[i%len(rbSelectors)], watchList: i%4 == 3, bookmarks: i%2 == 0,
					rnd: rand.New(rand.NewPCG(seed, uint64(i))), acked: w.acked.Load, settled: &settled, seen: map[string]bool{}}
				switch i % 3 {
				case 1:
					c.pause = -1
				case 2:
					c.pause = time.Duration(400+rnd.IntN(1600)) * time.Microsecond
				}
				if rnd.IntN(3) == 0 {
					c.rewatchEvery = 20 + rnd.IntN(200)
				}
				if r.name == "idle" && i%2 == 1 {
					c.rewatchIdle = time.Duration(300+rnd.IntN(500)) * time.Millisecond
				}
				mine = append(mine, c)
			}
			clients[impl] = append(clients[impl], mine...)
			pick := rand.New(rand.NewPCG(seed, uint64(len(listers[impl]))))
			l := &rbLister{name: fmt.Sprintf("%s/%s/lister", impl, r.name), res: r, cache: r.caches[impl], acked: w.acked.Load,
				handed: func() int64 {
					// One in the middle of a client's, or the newest any
					// client holds: a state older than every snapshot, or
					// the head, which the cache rebuilds from its current
					// state while the next revision may be on its way in
					// (a continue after a progress notification).
					if pick.IntN(2) == 0 {
						newest := int64(0)
						for _, c := range mine {
							c.mu.Lock()
							if n := len(c.handed); n > 0 {
								newest = max(newest, c.handed[n-1])
							}
							c.mu.Unlock()
						}
						return newest
					}
					c := mine[pick.IntN(len(mine))]
					c.mu.Lock()
					defer c.mu.Unlock()
					if len(c.handed) == 0 {
						return 0
					}
					return c.handed[len(c.handed)/2]
				}}
			listers[impl] = append(listers[impl], l)
			for _, c := range mine {
				wg.Add(1)
				go func() { defer wg.Done(); c.run(clientCtx) }()
			}
			wg.Add(1)
			go func() { defer wg.Done(); l.run(clientCtx) }()
		}
	}

	faultsCtx, stopFaults := context.WithCancel(ctx)
	var faults sync.WaitGroup
	if opts.faults != nil {
		faults.Add(1)
		go func() { defer faults.Done(); opts.faults(faultsCtx) }()
	}
	if err := w.run(ctx, rbFor); err != nil {
		t.Fatalf("traffic (seed %d): %v", seed, err)
	}
	stopFaults()
	faults.Wait()
	if opts.disarm != nil {
		opts.disarm()
	}
	healthy := time.Now()
	// What the traffic left on leases expires; then a last object every
	// client selects, which clients that went back read on to.
	settled.Store(true)
	if err := w.waitExpired(ctx); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	sentinels := map[*rbResource]string{}
	for _, r := range env.resources {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "zz-last", Labels: map[string]string{"tier": "gold"}},
			Spec: example.PodSpec{NodeName: "node-1"}}
		out := &example.Pod{}
		if err := r.store.Create(ctx, r.prefix+"ns/zz-last", pod, out, 0); err != nil {
			t.Fatal(err)
		}
		if err := w.ackObject(out); err != nil {
			t.Fatal(err)
		}
		sentinels[r] = r.prefix + "ns/zz-last"
	}
	for _, r := range env.resources {
		if err := r.truth.WaitFor(ctx, env.client, w.acked.Load(), 30*time.Second); err != nil {
			t.Fatalf("the ground truth never reached %d: %v", w.acked.Load(), err)
		}
	}
	// Every client gets the last object, or the run says which did not.
	// Healthy, both caches deliver it within a second; 15 s is for a
	// loaded machine, and bounds the runs where an injected bug keeps it
	// from a client.
	_ = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		for _, cs := range clients {
			for _, c := range cs {
				if !c.has(sentinels[c.res]) {
					return false, nil
				}
			}
		}
		return true, nil
	})
	undelivered := map[string][]string{}
	for impl, cs := range clients {
		for _, c := range cs {
			if !c.has(sentinels[c.res]) {
				undelivered[impl] = append(undelivered[impl], c.name+": "+c.describe())
			}
		}
	}
	stopClients()
	wg.Wait()
	t.Logf("seed %d, traffic: %s", seed, w.steps())
	live := map[string]watchcheck.Violations{}
	for _, r := range env.resources {
		for _, impl := range rbImpls {
			v := live[impl]
			v.Add(probeLiveness(ctx, r, r.caches[impl], handedTo(clients[impl], r), w, healthy))
			live[impl] = v
		}
	}

	var out []rbResult
	for _, impl := range rbImpls {
		r := rbResult{profile: p.name, seed: seed, impl: impl}
		r.Add(live[impl])
		for _, name := range undelivered[impl] {
			r.Note(&r.Reliable, "%s never received the last object", name)
		}
		for _, c := range clients[impl] {
			r.Add(c.check(w))
		}
		for _, l := range listers[impl] {
			r.Add(l.check(w))
		}
		out = append(out, r)
	}
	return out
}

// check checks everything a client was handed against etcd's history.
func (c *rbClient) check(w *rbWriter) watchcheck.Violations {
	var v watchcheck.Violations
	changes, err := c.res.truth.Changes()
	if err != nil {
		v.Note(&v.Reliable, "%s: the ground truth is incomplete: %v", c.name, err)
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, seg := range c.segments {
		v.Add(watchcheck.CheckSegment(c.name, changes, c.sel.match, *seg))
	}
	for _, l := range c.lists {
		v.Add(watchcheck.CheckList(c.res.truth, c.sel.match, l))
	}
	for _, g := range c.gone {
		checkGone(&v, c.name, c.cache, w, g)
	}
	return v
}

func (l *rbLister) check(w *rbWriter) watchcheck.Violations {
	var v watchcheck.Violations
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, list := range l.lists {
		v.Add(watchcheck.CheckList(l.res.truth, func(*rbPod) bool { return true }, list))
	}
	for _, g := range l.gone {
		checkGone(&v, l.name, l.cache, w, g)
	}
	return v
}

// checkGone counts a 410 for a resourceVersion a client was handed that
// the server had no reason for. The reasons are upstream's: etcd compacted
// past it, or the cache re-listed since (upstream's restarts). A
// progress notification is never one. Ours starts warm, filling its
// history from etcd's: a restart is no reason for it.
//
// Compacted past rev means compacted at a revision after it. etcd itself
// still serves a watch from C-1 after a compaction at C, but without the
// previous values of what changed at C, which compaction removed: the
// etcd3 store's watch then answers 410, and upstream's conformance expects
// it (RunTestWatchFromZero).
func checkGone(v *watchcheck.Violations, who string, c *rbCache, w *rbWriter, g rbGone) {
	if g.rev < w.compactedBefore(g.at) {
		return
	}
	if c.lostHistorySince(g.rev) {
		return
	}
	v.Note(&v.Resumable, "%s: 410 for resourceVersion %d, which etcd (compacted at %d) still serves: %s",
		who, g.rev, w.compactedBefore(g.at), g.msg)
}

// rbTable is the runs' results, one row per profile and implementation,
// summed over seeds.
func rbTable(results []rbResult) string {
	type key struct{ profile, impl string }
	sums := map[key]*rbResult{}
	seeds := map[key]int{}
	var keys []key
	for _, r := range results {
		k := key{r.profile, r.impl}
		if sums[k] == nil {
			sums[k] = &rbResult{profile: r.profile, impl: r.impl}
			keys = append(keys, k)
		}
		sums[k].Add(r.Violations)
		seeds[k]++
	}
	sort.SliceStable(keys, func(i, j int) bool { return keys[i].profile < keys[j].profile })
	var b strings.Builder
	b.WriteString("| profile | cache | seeds | ordered | unique | atomic | bookmarkable | reliable | resumable | lists | consistent | liveness | split at an end |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range keys {
		s := sums[k]
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |\n", k.profile, k.impl, seeds[k],
			s.Ordered, s.Unique, s.Atomic, s.Bookmarkable, s.Reliable, s.Resumable, s.Lists, s.Consistent, s.Liveness, s.Split)
	}
	return b.String()
}
