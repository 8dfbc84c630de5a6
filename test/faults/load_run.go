package faults

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// loadListTimeout is how long a list right after a restart's /readyz
// may take under load before it counts against readiness: 20,000 streams
// re-opening on two cores held one for 2.6 s.
const loadListTimeout = 10 * time.Second

// loadWarmUp is how long the traffic runs before the fault: long enough
// to measure its rate, and for the server's RSS to be the steady state's.
const loadWarmUp = 10 * time.Second

// runLoad is run under cfg's load: sc's topology and fault, the load's
// population, streams, writers and lister in place of the scenario's,
// and per-stream sentinels after the heal. Every stream and list is
// checked against etcd's history as in run.
func runLoad(t *testing.T, sc scenario, cfg loadConfig, impl, injected string, seed uint64) *result {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc.serverArgs = append(slices.Clone(sc.serverArgs), "--max-watches", "0") // 20,000 is its default
	r := &result{scenario: loadName(sc, cfg), server: impl, seed: seed}
	if injected != "" {
		r.server = impl + " (" + injected + " injected)"
	}
	e := setUp(t, sc, impl, injected)
	e.seed = seed
	for _, s := range e.servers {
		s.mu.Lock()
		s.listTimeout = loadListTimeout
		s.mu.Unlock()
	}
	if err := e.populateLoad(ctx, cfg, seed); err != nil {
		t.Fatalf("populating: %v", err)
	}
	t.Logf("%d objects put into etcd and %d through the API; opening %d streams", cfg.objects, populated, len(cfg.streamSpecs()))
	clientCtx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	e.clientCtx = clientCtx
	e.lists = newListLog()
	load, err := e.openLoadStreams(ctx, cfg, sc.clientsTo)
	if err != nil {
		t.Fatal(err)
	}
	r.load = load
	e.startInformers(t, clientCtx, sc.clientsTo)

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	var trafficWG sync.WaitGroup
	trafficWG.Add(3)
	changesAtStart, trafficAt := e.truthLen(), time.Now()
	go func() { defer trafficWG.Done(); e.writer.run(trafficCtx, writeRate) }()
	go func() { defer trafficWG.Done(); e.txns.run(trafficCtx, cfg.txnInterval()) }()
	lists := e.newClient(sc.clientsTo)
	go func() {
		defer trafficWG.Done()
		loadLister(trafficCtx, lists, e.lists, e.writer.acked.Load, cfg.namespaces)
	}()
	if err := e.waitWrites(ctx, populated+minWritesBeforeFault, 30*time.Second); err != nil {
		t.Fatalf("invalid run: only %d writes went through before the fault", e.writer.succeeded()-populated)
	}
	// The RSS before the fault is sampled over the warm-up's end.
	hold(ctx, time.Until(trafficAt.Add(loadWarmUp-rssWindow)))
	if load.rssBefore, err = e.lowestRSS(ctx); err != nil {
		t.Fatal(err)
	}
	load.writesPerSecond = float64(e.truthLen()-changesAtStart) / time.Since(trafficAt).Seconds()

	t.Logf("streams synced in %v; the fault: %s", load.synced.Round(time.Second), sc.name)
	unready := e.watchReadyz(ctx)
	faultAt := time.Now()
	if err := sc.fault(ctx, e); err != nil {
		t.Fatalf("injecting %s: %v", sc.name, err)
	}
	healed := time.Now()
	t.Logf("healed %v after the fault began; the sentinels", healed.Sub(faultAt).Round(time.Millisecond))
	r.unready = unready()
	r.notes = append(r.notes, e.notes...)
	r.compactedUnder = e.compactedUnder
	head, err := e.headAfterHeal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	atHeal := e.writer.succeeded()
	r.readyAgain = e.readyAgain(ctx, healed)
	for _, s := range e.streams {
		s.settle()
	}
	rec, err := e.loadSentinels(ctx, e.txns.pool, head, healed)
	if err != nil {
		t.Fatal(err)
	}
	load.recovery = *rec
	t.Logf("%+.0fs: %d streams recovered, %d did not", time.Since(healed).Seconds(), len(rec.after), rec.unrecovered)
	r.recovery = percentile(rec.after, 1)
	r.sentinelLatency = percentile(rec.delivery, 1)
	r.undelivered = rec.unrecovered
	for _, m := range rec.missing {
		r.notef("did not receive a write made after the heal within %v: %s", loadRecoveryDeadline, m)
	}
	e.afterHeal(ctx, r, atHeal)
	if load.rssAfter, load.rssSettled, err = e.settledRSS(ctx, load.rssBefore); err != nil {
		t.Fatal(err)
	}
	stopTraffic()
	trafficWG.Wait()
	t.Logf("%+.0fs: traffic stopped; validating", time.Since(healed).Seconds())
	e.finishLoad(ctx, r)
	stopClients()
	e.clientWG.Wait()
	e.validate(r)
	e.serverMetrics(ctx, r)
	e.noteRelists(r, healed)
	t.Log(r.summary())
	t.Log(load.summary())
	return r
}

// populateLoad puts cfg's objects straight into etcd, as the servers
// store them, then starts the truth, so that they are its initial state,
// and has the writer create its own through the API.
func (e *env) populateLoad(ctx context.Context, cfg loadConfig, seed uint64) error {
	e.writer = newWriter(e.client, seed)
	e.txns = newTxnWriter(e.cluster.client, seed, e.writer.ack)
	e.txns.pool = cfg.keys()
	values, err := e.txns.values(e.txns.pool)
	if err != nil {
		return err
	}
	if _, err := putAll(ctx, e.cluster.client, e.txns.pool, values, 2*time.Minute); err != nil {
		return err
	}
	if e.truth, err = startTruth(ctx, e.cluster.truthClient, etcdPrefix); err != nil {
		return err
	}
	if e.agentTruth, err = startTruth(ctx, e.cluster.truthClient, agentsEtcdPrefix); err != nil {
		return err
	}
	if err := e.writer.populate(ctx, populated); err != nil {
		return err
	}
	e.oldRV = e.writer.acked.Load()
	return nil
}

// openLoadStreams opens cfg's streams, loadStreamsPerConn to a client,
// loadOpenBatch at a time, each batch once the one before has synced:
// 20,000 consistent lists at once, or even 2,000 a second, timed out
// asking etcd for its revision, and the streams spent minutes retrying.
func (e *env) openLoadStreams(ctx context.Context, cfg loadConfig, clientsTo int) (*loadResult, error) {
	specs := cfg.streamSpecs()
	clients := make([]versioned.Interface, (len(specs)+loadStreamsPerConn-1)/loadStreamsPerConn)
	for i := range clients {
		clients[i] = e.newClient(clientsTo)
	}
	opened := time.Now()
	syncTimeout := time.Minute + time.Duration(len(specs))*10*time.Millisecond
	deadline := opened.Add(syncTimeout)
	for from := 0; from < len(specs); from += loadOpenBatch {
		for i := from; i < min(from+loadOpenBatch, len(specs)); i++ {
			s := newStream(specs[i], clients[i/loadStreamsPerConn], e.lists, e.writer.acked.Load)
			e.streams = append(e.streams, s)
			e.clientWG.Add(1)
			go func() {
				defer e.clientWG.Done()
				s.run(e.clientCtx)
			}()
		}
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Until(deadline), true, func(context.Context) (bool, error) {
			for _, s := range e.streams[from:] {
				s.mu.Lock()
				synced := len(s.segments) > 0 && s.segments[0].initial == nil
				s.mu.Unlock()
				if !synced {
					return false, nil
				}
			}
			return true, nil
		}); err != nil {
			return nil, fmt.Errorf("the %d streams did not sync within %v (%d started)", len(specs), syncTimeout, len(e.streams))
		}
	}
	load := &loadResult{cfg: cfg, streams: len(specs), synced: time.Since(opened)}
	for _, s := range e.streams {
		s.mu.Lock()
		load.syncFailures += s.openErrs
		s.mu.Unlock()
	}
	return load, nil
}

// finalListBound is how long after the traffic stopped the final list
// under load may fail before that is a liveness violation: the streams
// that re-listed after a restart may still be at it.
const finalListBound = time.Minute

// finishLoad is finish, but for a final list that fails, which it retries
// for finalListBound, and then counts as a liveness violation instead of
// ending the run unreported.
func (e *env) finishLoad(ctx context.Context, r *result) {
	last := e.writer.acked.Load()
	for _, t := range []*truth{e.truth, e.agentTruth} {
		if err := t.WaitFor(ctx, e.cluster.truthClient, last, 30*time.Second); err != nil {
			e.tb.Fatalf("the ground truth never reached %d: %v", last, err)
		}
	}
	var fresh *v1beta1.AssignmentList
	var listErr error
	relist := func() bool {
		var l *v1beta1.AssignmentList
		if l, listErr = e.client.FleetV1beta1().Assignments("").List(ctx, metav1.ListOptions{}); listErr != nil {
			return false
		}
		fresh = l
		e.lists.add(listResult{who: "final list", rv: parseRV(fresh.ResourceVersion), items: itemsOf(fresh.Items), consistent: true, minRV: last})
		return true
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, finalListBound, true, func(context.Context) (bool, error) {
		return relist(), nil
	}); err != nil {
		r.Note(&r.Liveness, "the final list failed for %v after the traffic stopped: %v", finalListBound, listErr)
		return
	}
	e.checkInformers(ctx, r, func() *v1beta1.AssignmentList { relist(); return fresh }, fresh)
}

// noteRelists names the first streams and the informers that re-listed,
// with their history since the heal.
func (e *env) noteRelists(r *result, healed time.Time) {
	named := 0
	for _, s := range e.streams {
		s.mu.Lock()
		n, errs := s.relists, s.openErrs
		s.mu.Unlock()
		if n == 0 {
			continue
		}
		if named++; named <= maxMissing {
			r.notef("%s re-listed %d times (%d failed opens): %s", s.spec.name, n, errs, s.history(healed))
		}
	}
	if named > maxMissing {
		r.notef("and %d more streams re-listed", named-maxMissing)
	}
	for _, inf := range e.informers {
		if n := inf.relists(); n > 0 {
			r.notef("%s re-listed %d times", inf.name, n)
		}
	}
}

// rssWindow is how long the server's RSS is sampled, before the fault
// and after recovery, every rssEvery: the lowest sample is its RSS, as the
// soak's leak check takes the lowest of a few, since garbage and freed
// pages not yet returned come and go with the traffic.
const (
	rssWindow = 5 * time.Second
	rssEvery  = 500 * time.Millisecond
)

// lowestRSS samples the first server's RSS over rssWindow and returns the
// lowest sample.
func (e *env) lowestRSS(ctx context.Context) (int64, error) {
	var lowest int64
	var readErr error
	_ = wait.PollUntilContextTimeout(ctx, rssEvery, rssWindow, true, func(context.Context) (bool, error) {
		rss, err := e.servers[0].proc.RSS()
		if err != nil {
			readErr = err
			return false, err
		}
		if lowest == 0 || rss < lowest {
			lowest = rss
		}
		return false, nil
	})
	return lowest, readErr
}

// rssTolerance is how much more RSS than just before the fault our
// server may hold once every stream recovered: the 1.2×.
const rssTolerance = 1.2

// rssSettleBound is how long after recovery the server's RSS may take to
// come within rssTolerance of before the fault: a server that restarted
// holds the garbage of its start and of the streams' return until its
// runtime returns the pages (5,000 streams: 1.47× over the first 5 s).
const rssSettleBound = time.Minute

// settledRSS samples the first server's RSS for rssWindow, and on, for up
// to rssSettleBound, until the lowest sample is within rssTolerance of
// before. It returns the lowest sample and when it was taken.
func (e *env) settledRSS(ctx context.Context, before int64) (int64, time.Duration, error) {
	start := time.Now()
	var lowest int64
	var at time.Duration
	var readErr error
	_ = wait.PollUntilContextTimeout(ctx, rssEvery, rssSettleBound, true, func(context.Context) (bool, error) {
		rss, err := e.servers[0].proc.RSS()
		if err != nil {
			readErr = err
			return false, err
		}
		if lowest == 0 || rss < lowest {
			lowest, at = rss, time.Since(start)
		}
		return time.Since(start) >= rssWindow && float64(lowest) <= rssTolerance*float64(before), nil
	})
	return lowest, at, readErr
}

// truthLen is how many changes of Assignments etcd recorded since the
// truth began.
func (e *env) truthLen() int {
	changes, _ := e.truth.Changes()
	return len(changes)
}

// watchReadyz asks the first server's /readyz every 200 ms until the
// function it returns is called, which says whether it ever failed.
func (e *env) watchReadyz(ctx context.Context) func() bool {
	done := make(chan struct{})
	result := make(chan bool, 1)
	go func() {
		unready := false
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				result <- unready
				return
			case <-tick.C:
				// ctx, not done: the fault's end must not cancel a probe in flight.
				unready = unready || e.servers[0].readyz(ctx) != 200
			}
		}
	}()
	return func() bool {
		close(done)
		return <-result
	}
}

// headAfterHeal returns etcd's revision once it answers after the heal:
// a write above it was made after the heal.
func (e *env) headAfterHeal(ctx context.Context) (int64, error) {
	var head int64
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var err error
		head, err = e.cluster.head(hctx)
		return err == nil, nil
	})
	if err != nil {
		return 0, fmt.Errorf("etcd did not answer within 30 s of the heal: %w", err)
	}
	return head, nil
}
