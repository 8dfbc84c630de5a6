package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Issue 65, item 4: an etcd process fault at a random moment of the
// server's life. The fault restarts the server, so that its start, its
// caches' first lists and their warm-start backfills happen during the
// run, and puts one etcd fault, drawn from the run's seed, at a moment
// drawn uniformly from the server's start to 2 s after its backfills end,
// or, in a third of the runs, in the steady state after. The traffic, the
// streams and the informers run on through it, as in every scenario;
// after the heal, checkLiveness watches from resourceVersions the clients
// were handed before the fault.

// Bounds of the drawn fault.
const (
	// minEtcdFault and maxEtcdFault bound how long a drawn pause or kill of
	// a member lasts: the 1–60 s under make chaos. make test draws
	// up to shortEtcdFault, which keeps the scenario within its share of
	// make test's time (issue 65 allows it 2 minutes in all) and is still
	// past the 8–9 s in which the cache finds a silent watch.
	minEtcdFault   = time.Second
	maxEtcdFault   = 60 * time.Second
	shortEtcdFault = 12 * time.Second
	// backfillMargin is how far past the backfills' end the moment may
	// fall: the 2 s.
	backfillMargin = 2 * time.Second
	// steadySpread is how far past the margin a steady-state moment falls.
	steadySpread = 5 * time.Second
	// inBackfillSpread is how far after /readyz an insideBackfill moment
	// falls: inside the 3 s for which a failpoint holds the backfill,
	// which begins at /readyz (backfillListFailpoint).
	inBackfillSpread = 2 * time.Second
	// relistCut is how long a duringRelist moment keeps the server from
	// etcd, whose compaction meanwhile passes its caches' heads: longer
	// than the 8–9 s in which ours finds its watch silent, so that its
	// re-watch meets the compaction and the cache lists again once the
	// server reaches etcd.
	relistCut = 10 * time.Second
	// relistSpread is how far after the server reaches etcd again a
	// duringRelist moment falls.
	relistSpread = 3 * time.Second
	// relistHold is how long relistFailpoint holds ours' re-lists before
	// they read etcd, and how far after the server reaches etcd again an
	// insideRelist moment falls: inside the re-list.
	relistHold = 3 * time.Second
	// backfillPoll is how often a start's backfill counts are scraped.
	backfillPoll = 100 * time.Millisecond
	// backfillEndTimeout bounds the wait for a start's backfills to end.
	backfillEndTimeout = time.Minute
	// momentStream is the random stream of the moment's draws, beside the
	// writers' streams from the same seed.
	momentStream = 0x6d6f6d656e74 // "moment"
)

// longEtcdFaults has moments draw faults up to maxEtcdFault: make chaos
// sets it (TestMain).
var longEtcdFaults bool

// etcdFault is one of the etcd process faults a moment can draw.
type etcdFault string

const (
	// memberPaused stops the server's member with SIGSTOP and continues it
	// with SIGCONT: it keeps its sockets and answers nothing meanwhile.
	memberPaused etcdFault = "SIGSTOP/SIGCONT of the server's member"
	// memberKilled SIGKILLs a member, any of the three, and restarts it.
	memberKilled etcdFault = "SIGKILL and restart of a member"
	// leaderLost is leaderLoss: the server's member loses its leader.
	leaderLost etcdFault = "leader loss"
)

// etcdFaults are the faults a moment draws from, evenly.
var etcdFaults = []etcdFault{memberPaused, memberKilled, leaderLost}

// momentWindow is where a moment is drawn.
type momentWindow int

const (
	// aroundStart draws, two runs in three, from [the server's start, 2 s
	// after its backfills end], measured by a restart before the one the
	// fault hits; and, one in three, in the steady state after that.
	aroundStart momentWindow = iota
	// insideBackfill draws from [/readyz, /readyz + inBackfillSpread], for a
	// server whose backfill a failpoint holds open: inside the backfill. A
	// run whose backfill had ended by then is invalid.
	insideBackfill
	// duringRelist makes the server's caches list again, and draws from
	// [the server reaching etcd again, + relistSpread]: during the re-list,
	// or right after it. aroundStart draws it in a quarter of its runs.
	// The server is cut off (its proxy blackholed) for relistCut while etcd
	// is compacted to its head: ours finds its watch silent, and its
	// re-watch from its head meets the compaction. Upstream's watch, which
	// only gRPC's keepalive (40 s) finds silent, may carry on after the cut
	// without a re-list: the moment is then after the same cut.
	duringRelist
	// insideRelist is duringRelist with ours' re-lists held open by
	// relistFailpoint for relistHold once they begin, and the moment drawn
	// from [the server reaching etcd again, + relistHold]: inside the
	// re-list, which the harness's few hundred objects otherwise end
	// within 0.5 s, so that the etcd fault meets the re-list's read. A run
	// whose caches had listed again by the moment is invalid. Upstream,
	// which has no failpoint, gets the duringRelist moment.
	insideRelist
)

// relistFailpoint holds each of the two caches' first re-list for
// relistHold, after the cache ended its watchers and before it reads etcd
// (inject.Relist): the re-list's state, Pending, with its 429s, while the
// drawn etcd fault begins.
var relistFailpoint = fmt.Sprintf("relist=sleep(%v)*2", relistHold)

// momentFault is the random-moment fault.
type momentFault struct {
	window momentWindow
	// kind and length, when set, replace the drawn fault and its length.
	kind   etcdFault
	length time.Duration
	// noRelist keeps aroundStart from drawing a moment at a re-list:
	// under load, where its compaction makes every client re-list.
	noRelist bool
}

// randomMoment is m's fault function. It returns once etcd has healed,
// with checkLiveness started on what the clients were handed before.
func randomMoment(m momentFault) func(context.Context, *env) error {
	return m.inject
}

// draw is what a run's seed drew: always in this order, so that a seed
// replays the same draws whatever its window.
type draw struct {
	kind   etcdFault
	length time.Duration
	// victim is the member killed; the server's member for a pause.
	victim int
	steady bool
	// at is where in its window the moment falls, in [0, 1).
	at float64
	// relist makes an aroundStart moment a duringRelist one. Drawn last,
	// so that the draws before it replay as they did before it existed.
	relist bool
}

func (m momentFault) draw(e *env) draw {
	rng := rand.New(rand.NewPCG(e.seed, momentStream))
	longest := shortEtcdFault
	if longEtcdFaults {
		longest = maxEtcdFault // a seed replays with the flags it ran with
	}
	d := draw{kind: etcdFaults[rng.IntN(len(etcdFaults))],
		length: minEtcdFault + time.Duration(rng.Int64N(int64(longest-minEtcdFault)+1)),
		victim: rng.IntN(len(e.cluster.Members)), steady: rng.IntN(3) == 0, at: rng.Float64()}
	d.relist = m.window == aroundStart && rng.IntN(4) == 0 && !m.noRelist
	if m.kind != "" {
		d.kind = m.kind
	}
	if m.length > 0 {
		d.length = m.length
	}
	if d.kind != memberKilled {
		d.victim = e.serverMembers[0]
	}
	d.steady = d.steady && m.window == aroundStart
	return d
}

func (m momentFault) inject(ctx context.Context, e *env) error {
	d := m.draw(e)
	var (
		st        *serverStart
		at        time.Time
		before    []int64
		err       error
		window    string
		calibrate string
	)
	var relist *relistFollow
	switch {
	case d.relist || m.window == duringRelist || m.window == insideRelist:
		before = e.handedRVs()
		if relist, err = e.cutForRelist(ctx); err != nil {
			return err
		}
		spread, inside := relistSpread, ""
		if m.window == insideRelist && e.servers[0].impl == ours {
			spread, inside = relistHold, ", ours' re-lists held there by a failpoint"
		}
		at = relist.at.Add(time.Duration(d.at * float64(spread)))
		window = fmt.Sprintf("[the server reaching etcd again, +%v], after %v cut off while etcd was compacted to its head%s",
			spread, relistCut, inside)
	case m.window == insideBackfill:
		before = e.handedRVs()
		if st, err = e.restartFollowed(ctx); err != nil {
			return err
		}
		ready, err := st.waitReady(ctx)
		if err != nil {
			return err
		}
		at = ready.Add(time.Duration(d.at * float64(inBackfillSpread)))
		window = fmt.Sprintf("[/readyz, +%v] inside the backfill", inBackfillSpread)
	case d.steady:
		before = e.handedRVs()
		if st, err = e.restartFollowed(ctx); err != nil {
			return err
		}
		end, err := st.waitBackfill(ctx)
		if err != nil {
			return err
		}
		at = end.Add(backfillMargin + time.Duration(d.at*float64(steadySpread)))
		window = fmt.Sprintf("steady state, [backfills' end + %v, + %v]", backfillMargin, backfillMargin+steadySpread)
	default:
		// The window's length is measured on a start before the one the
		// fault hits: its end is known only once the backfills ended.
		cal, err := e.restartFollowed(ctx)
		if err != nil {
			return err
		}
		end, err := cal.waitBackfill(ctx)
		if err != nil {
			return err
		}
		length := end.Add(backfillMargin).Sub(cal.at)
		calibrate = "; the window measured on a restart before: " + cal.timeline(time.Now())
		before = e.handedRVs()
		if st, err = e.restartFollowed(ctx); err != nil {
			return err
		}
		at = st.at.Add(time.Duration(d.at * float64(length)))
		window = fmt.Sprintf("[start, backfills' end + %v] = %.2fs", backfillMargin, length.Seconds())
	}
	hold(ctx, time.Until(at))
	handed := e.handedRVs()
	injected := time.Now()
	var phase string
	relisted := 0.0
	if relist != nil {
		st = &serverStart{at: relist.at}
		phase, relisted = relist.timeline(ctx, e.servers[0], injected)
	} else {
		phase = st.timeline(injected)
	}
	if m.window == insideBackfill && !st.backfilling(injected) {
		return fmt.Errorf("invalid run: the moment missed the backfill (%s)", phase)
	}
	if m.window == insideRelist && e.servers[0].impl == ours && relisted != 0 {
		return fmt.Errorf("invalid run: the moment missed the re-list (%s)", phase)
	}
	what := string(d.kind)
	switch d.kind {
	case memberPaused, memberKilled:
		what += fmt.Sprintf(" (member %d) for %v", d.victim+1, d.length)
	}
	if err := m.apply(ctx, e, d); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	healed := time.Now()
	from := "the server's start"
	if relist != nil {
		from = "the server reaching etcd again"
	}
	e.notef("random moment (seed %d): %s at %+.2fs from %s, drawn from %s; at the moment: %s%s; healed %.2fs after",
		e.seed, what, injected.Sub(st.at).Seconds(), from, window, phase, calibrate, healed.Sub(injected).Seconds())
	rvs := pickRVs(before, handed, livenessRVs)
	done := make(chan *livenessResult, 1)
	e.liveness = done
	go func() { done <- e.checkLiveness(ctx, rvs, healed) }()
	return nil
}

// apply injects d's fault and waits until etcd has a leader that every
// member answers with.
func (m momentFault) apply(ctx context.Context, e *env, d draw) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	switch d.kind {
	case memberPaused:
		p := e.cluster.Procs[d.victim]
		if err := p.Pause(); err != nil {
			return err
		}
		// Registered after the cluster's: runs before its members are
		// killed and its clients closed, so that nothing waits on a
		// stopped member.
		e.tb.Cleanup(func() { _ = p.Resume() })
		hold(ctx, d.length)
		if err := p.Resume(); err != nil {
			return err
		}
		return e.cluster.waitLeader(wctx)
	case memberKilled:
		return killAndRestart(func(*env) []int { return []int{d.victim} }, d.length)(wctx, e)
	case leaderLost:
		return leaderLoss(wctx, e)
	}
	return fmt.Errorf("no etcd fault %q", d.kind)
}

// relistFollow is a duringRelist moment's cut: when the server reached
// etcd again, and its caches' lists before the cut.
type relistFollow struct {
	at     time.Time
	before float64
}

// cachesListed is the metric that counts a cache's lists, its first one
// included: ours and upstream's alike.
const cachesListed = "apiserver_watch_cache_initializations_total"

// cutForRelist keeps the first server from etcd for relistCut, compacts
// etcd to its head meanwhile, and lets the server reach etcd again.
func (e *env) cutForRelist(ctx context.Context) (*relistFollow, error) {
	s := e.servers[0]
	before, err := s.metric(ctx, cachesListed)
	if err != nil {
		return nil, err
	}
	p := e.proxies[e.serverMembers[0]]
	p.Blackhole()
	hold(ctx, relistCut)
	err = e.cluster.compactToHead(ctx)
	e.compactedUnder = true
	p.Heal()
	if err != nil {
		return nil, fmt.Errorf("compacting etcd during the cut: %w", err)
	}
	return &relistFollow{at: time.Now(), before: before}, nil
}

// timeline says, at t, how many lists the server's caches made since the
// cut began, and returns that count: -1 where it is unknown.
func (r *relistFollow) timeline(ctx context.Context, s *apiServer, t time.Time) (string, float64) {
	out := fmt.Sprintf("%+.2fs after the server reached etcd again", t.Sub(r.at).Seconds())
	n, err := s.metric(ctx, cachesListed)
	if err != nil {
		return out + fmt.Sprintf(" (its caches' lists unknown: %v)", err), -1
	}
	return out + fmt.Sprintf(", its caches listed %.0f times since the cut began", n-r.before), n - r.before
}

// serverStart follows one start of the first server: when it began, when
// /readyz first answered 200, and when its caches' warm-start backfills
// ended, from its metrics (ours), or /readyz's 200 (upstream, which has
// no backfill).
type serverStart struct {
	at time.Time
	// ready is closed once the start's waitReady returned: readyAt is
	// when /readyz answered 200, zero if it did not, and readyErr why not.
	ready    chan struct{}
	readyAt  time.Time
	readyErr error
	// ended is closed once the backfills ended, or the wait for them did.
	ended chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// backfillEnd is when the backfills were first seen ended.
	backfillEnd time.Time
	// backfills are the backfill counts last scraped, for the notes.
	backfills string
	endErr    error
}

// restartFollowed stops the first server with SIGTERM, as a rolling
// update does, starts it again, and returns at once, with its readiness
// and its backfills followed in the background.
func (e *env) restartFollowed(ctx context.Context) (*serverStart, error) {
	s := e.servers[0]
	if err := s.proc.Terminate(time.Minute); err != nil {
		return nil, err
	}
	if err := s.proc.Start(); err != nil {
		return nil, err
	}
	st := &serverStart{at: time.Now(), ready: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(st.ready)
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if st.readyErr = s.waitReady(rctx, ""); st.readyErr == nil {
			s.mu.Lock()
			st.readyAt = s.starts[len(s.starts)-1].readyz
			s.mu.Unlock()
		}
	}()
	go func() {
		defer close(st.ended)
		if s.impl != ours {
			<-st.ready
			st.mu.Lock()
			st.backfillEnd, st.endErr = st.readyAt, st.readyErr
			st.mu.Unlock()
			return
		}
		err := st.followBackfills(ctx, s)
		st.mu.Lock()
		st.endErr = err
		st.mu.Unlock()
	}()
	return st, nil
}

// followBackfills scrapes ours' backfill counts until every resource's
// first backfill, and any after it, has ended: filled, given up or
// abandoned.
func (st *serverStart) followBackfills(ctx context.Context, s *apiServer) error {
	const name = "cached_apiserver_watch_cache_backfills_total"
	deadline := time.Now().Add(backfillEndTimeout)
	for time.Now().Before(deadline) {
		var n [4]float64
		var err error
		for i, result := range []string{"started", "filled", "given_up", "abandoned"} {
			if err == nil {
				n[i], err = s.metric(ctx, name, `result="`+result+`"`)
			}
		}
		if err == nil {
			st.mu.Lock()
			st.backfills = fmt.Sprintf("backfills started %.0f, filled %.0f, given up %.0f, abandoned %.0f", n[0], n[1], n[2], n[3])
			st.mu.Unlock()
			if n[0] >= float64(len(listed)) && n[1]+n[2]+n[3] >= n[0] {
				st.mu.Lock()
				st.backfillEnd = time.Now()
				st.mu.Unlock()
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backfillPoll):
		}
	}
	return fmt.Errorf("the backfills did not end within %v of the server's start", backfillEndTimeout)
}

// waitReady waits for the start's /readyz 200.
func (st *serverStart) waitReady(ctx context.Context) (time.Time, error) {
	select {
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	case <-st.ready:
		return st.readyAt, st.readyErr
	}
}

// waitBackfill waits for the start's backfills to end and returns when
// they did: for upstream, when /readyz answered 200.
func (st *serverStart) waitBackfill(ctx context.Context) (time.Time, error) {
	select {
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	case <-st.ended:
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.backfillEnd, st.endErr
}

// backfilling tells whether, at t, the server was ready and its backfills
// had not ended.
func (st *serverStart) backfilling(t time.Time) bool {
	select {
	case <-st.ready:
	default:
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return !st.readyAt.IsZero() && st.readyAt.Before(t) && (st.backfillEnd.IsZero() || st.backfillEnd.After(t))
}

// timeline says where the start stood at t, from its beginning.
func (st *serverStart) timeline(t time.Time) string {
	out := fmt.Sprintf("%+.2fs since the start", t.Sub(st.at).Seconds())
	select {
	case <-st.ready:
		if st.readyAt.IsZero() || st.readyAt.After(t) {
			return out + ", /readyz not yet 200"
		}
		out += fmt.Sprintf(", /readyz 200 at %+.2fs", st.readyAt.Sub(st.at).Seconds())
	default:
		return out + ", /readyz not yet 200"
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.backfillEnd.IsZero() || st.backfillEnd.After(t) {
		return out + ", backfills running (" + st.backfills + ")"
	}
	if st.backfills == "" {
		return out + " (no backfills to follow)"
	}
	return out + fmt.Sprintf(", backfills ended at %+.2fs (%s)", st.backfillEnd.Sub(st.at).Seconds(), st.backfills)
}

// handedRVs returns every resourceVersion of assignments the clients were
// handed so far, by lists, watch-lists, events and bookmarks, sorted and
// without repeats.
func (e *env) handedRVs() []int64 {
	var out []int64
	for _, s := range e.streams {
		if s.spec.sel.resource == agentsRes {
			continue
		}
		s.mu.Lock()
		out = append(out, s.handed...)
		s.mu.Unlock()
	}
	e.lists.mu.Lock()
	for _, l := range e.lists.lists {
		if l.sel.resource != agentsRes {
			out = append(out, l.rv)
		}
	}
	e.lists.mu.Unlock()
	slices.Sort(out)
	out = slices.Compact(out)
	for len(out) > 0 && out[0] <= 0 {
		out = out[1:]
	}
	return out
}

// pickRVs picks up to n resourceVersions of handed, evenly spread: half
// from those handed before the server's restart, before, each the newest
// of its share, and half from those handed after it, the rest from before
// if after has too few.
func pickRVs(before, handed []int64, n int) []handedRV {
	var after []int64
	for _, rv := range handed {
		if _, ok := slices.BinarySearch(before, rv); !ok {
			after = append(after, rv)
		}
	}
	b := evenlyPicked(after, n/2)
	a := evenlyPicked(before, n-len(b))
	var out []handedRV
	for _, rv := range a {
		out = append(out, handedRV{rv: rv, beforeRestart: true})
	}
	for _, rv := range b {
		out = append(out, handedRV{rv: rv})
	}
	return out
}

// evenlyPicked returns up to n of the sorted xs, evenly spread and
// including the last.
func evenlyPicked(xs []int64, n int) []int64 {
	if len(xs) <= n {
		return xs
	}
	if n == 1 {
		return xs[len(xs)-1:]
	}
	out := make([]int64, 0, n)
	for i := range n {
		out = append(out, xs[i*(len(xs)-1)/(n-1)])
	}
	return out
}
