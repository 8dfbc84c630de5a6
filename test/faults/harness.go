package faults

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// Traffic of a run. 20 writes a second through the server is about what a
// small fleet's controllers make, and enough to keep every kind of
// selector moving during a few seconds of fault.
const (
	writeRate = 20
	// populated objects exist before the clients start.
	populated = 40
	// minWritesBeforeFault makes a run invalid when the traffic before the
	// fault was too low to prove anything, as etcd's robustness tests do.
	minWritesBeforeFault = 40
	// writesAfterHeal is how much traffic must go through after the heal
	// before the sentinels.
	writesAfterHeal = 20
	// txnInterval is how often the transaction writer writes beside the
	// servers: 5 transactions of 2–12 keys a second.
	txnInterval = 200 * time.Millisecond
	// sentinelDeadline is how long after the heal every open stream gets
	// to receive a write made after it: the 5 s, plus the time the
	// writes themselves take to go through again.
	sentinelDeadline = 10 * time.Second
)

// binaries are the programs a run starts, built once per test process.
type binaries struct {
	etcd, ours, oursFaulty, upstream string
}

// oursFaulty is our server with the faultinject tag.
var oursFaulty = testkit.Target{Name: "ours-faultinject", Package: "./cmd/cached-apiserver", Tags: "faultinject"}

func build(tb testing.TB) binaries {
	tb.Helper()
	p := testkit.Build(tb, testkit.Etcd, testkit.Ours, oursFaulty, testkit.Upstream)
	return binaries{etcd: p[0], ours: p[1], oursFaulty: p[2], upstream: p[3]}
}

// env is one run's system: etcd, proxies, the server, and the clients.
type env struct {
	tb      testing.TB
	dir     string
	cluster *cluster
	// proxies stand between the server and each member.
	proxies []*testkit.Proxy
	// serverMembers are the members each server's --etcd-servers lists.
	serverMembers []int
	// servers are the API server replicas; balancer spreads connections
	// over them when there are several.
	servers  []*apiServer
	balancer *testkit.Balancer
	// client is the writer's, lister's and final checks' client.
	client versioned.Interface
	// truth and agentTruth are etcd's history of the two resources.
	truth, agentTruth *truth
	writer            *writer
	// txns writes transactions straight to etcd, beside the servers.
	txns      *txnWriter
	lists     *listLog
	streams   []*stream
	probes    []*stream
	informers []*informer
	// oldRV is a resourceVersion from before the traffic, for probes.
	oldRV int64
	// clientsTo is the replica the watch clients use, or viaBalancer.
	clientsTo int

	clientCtx context.Context
	clientWG  sync.WaitGroup
	// probesMu guards probes, which a fault may add to, and notes.
	probesMu sync.Mutex
	notes    []string
	// storm is what the reconnect storm measured, once it has.
	storm *stormResult
	// silent is what the member-gone-silent scenario measured, once it has.
	silent *silentResult
	// soak is what the soak measured, once it has.
	soak *soakResult
	// compactedUnder is set by a fault that compacted etcd past what every
	// client held (a random moment during a re-list): their re-lists are
	// etcd's doing.
	compactedUnder bool
	// seed is the run's, for faults that draw from it.
	seed uint64
	// liveness, when a fault sets it, delivers what its liveness check
	// found after the heal (checkLiveness); run waits for it while the
	// traffic still runs.
	liveness <-chan *livenessResult
	// byKey indexes the truth's changes by key for single-object
	// selectors, once validate needs it (changesOf).
	byKey map[*truth]map[string][]watchcheck.Change[objState]
}

// notef records what a fault did, for the result.
func (e *env) notef(format string, args ...any) {
	e.probesMu.Lock()
	defer e.probesMu.Unlock()
	e.notes = append(e.notes, fmt.Sprintf(format, args...))
}

// startProbe opens a probe watch from the old resourceVersion.
// Its connection closes when it is done, so that the soak's leak check
// does not count the probes' idle connections: the server would close them
// only after its idle timeout (90 s).
func (e *env) startProbe(n int) {
	client, closeConns := e.newProbeClient()
	s := newStream(watchSpec{name: fmt.Sprintf("probe-%d", n), probeFrom: e.oldRV}, client, e.lists, e.writer.acked.Load)
	e.probesMu.Lock()
	e.probes = append(e.probes, s)
	e.probesMu.Unlock()
	e.clientWG.Add(1)
	go func() {
		defer e.clientWG.Done()
		defer closeConns()
		s.run(e.clientCtx)
	}()
}

// newProbeClient is newClient for a probe, with a function that closes
// every connection it dialed. http.Client.CloseIdleConnections does not
// reach the transport under client-go's round-tripper wrappers, and even
// through them the stream a probe just stopped may not yet have left its
// connection, which would then not be idle.
func (e *env) newProbeClient() (versioned.Interface, func()) {
	cfg := e.clientConfig(e.clientsTo)
	var mu sync.Mutex // guards conns
	var conns []net.Conn
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	return versioned.NewForConfigOrDie(cfg), func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}
}

// hold waits for d, the length of a fault, unless ctx ends first.
func hold(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitWrites waits until n writes in all have been acknowledged.
func (e *env) waitWrites(ctx context.Context, n int, timeout time.Duration) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return e.writer.succeeded() >= n, nil
	})
}

// viaBalancer, as a scenario's clientsTo or writerTo, sends clients
// through the balancer rather than to one replica.
const viaBalancer = -1

// newClient returns a client of replica target, or of the balancer, with a
// connection of its own: client-go shares one HTTP/2 connection per
// transport, and a balancer spreads connections, not requests.
func (e *env) newClient(target int) versioned.Interface {
	cfg := e.clientConfig(target)
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	cfg.Dial = dialer.DialContext // a distinct dialer is a distinct transport
	return versioned.NewForConfigOrDie(cfg)
}

// clientConfig is the admin's config for replica target, or the balancer.
func (e *env) clientConfig(target int) *rest.Config {
	cfg := rest.CopyConfig(e.servers[0].config)
	if target == viaBalancer && e.balancer != nil {
		cfg.Host = "https://" + e.balancer.Addr()
	} else {
		cfg.Host = e.servers[max(target, 0)].config.Host
	}
	return cfg
}

// streamSpecs are the raw watch clients of a run: in each 50, streams over
// every kind of selector the agents and controllers use, with and without
// bookmarks, ten of them syncing by watch-list.
func streamSpecs(n int) []watchSpec {
	var specs []watchSpec
	for len(specs) < n {
		specs = append(specs, fiftyStreams(len(specs))...)
	}
	return specs[:n]
}

func fiftyStreams(first int) []watchSpec {
	var specs []watchSpec
	add := func(n int, sel selector, watchList bool) {
		for i := 0; i < n; i++ {
			specs = append(specs, watchSpec{
				name: fmt.Sprintf("w%03d %s", first+len(specs), sel), sel: sel,
				bookmarks: watchList || i%2 == 0, watchList: watchList,
			})
		}
	}
	add(8, selector{}, false)
	add(4, selector{namespace: "faults-a"}, false)
	add(2, selector{namespace: "faults-b"}, false)
	for _, agent := range agents {
		add(2, selector{field: "spec.agentName=" + agent}, false)
	}
	add(4, selector{field: "status.phase=Running"}, false)
	add(4, selector{label: "tier=gold"}, false)
	add(2, selector{namespace: "faults-b", label: "tier=silver"}, false)
	add(2, selector{label: "tier in (gold)", field: "spec.agentName=agent-1"}, false)
	add(4, selector{}, true)
	add(3, selector{field: "spec.agentName=agent-2"}, true)
	add(3, selector{label: "tier=silver"}, true)
	// The idle resource beside the busy one: its caches hear mostly
	// progress notifications.
	add(2, selector{resource: agentsRes}, false)
	add(1, selector{resource: agentsRes, field: "spec.zone=zone-a"}, false)
	add(1, selector{resource: agentsRes}, true)
	// Consumers at every speed, and clients that go back to any
	// resourceVersion they were handed: a few of each, on both resources.
	for i := range specs {
		switch i % 10 {
		case 1, 6:
			specs[i].pause = time.Duration(400+1600*(i%5)/5) * time.Microsecond
		case 3:
			specs[i].backEvery = 30 + 20*(i%7)
		}
		if specs[i].sel.resource == agentsRes && i%2 == 0 {
			specs[i].backIdle = 2 * time.Second
		}
	}
	return specs
}

// run starts the system for sc against impl (ours, upstream, or ours with
// an injected fault in its cache), runs the traffic and the fault, and
// checks every invariant.
// setUp starts sc's etcd cluster, proxies, API server replicas and
// balancer, and the writer's client.
func setUp(t *testing.T, sc scenario, impl, injected string) *env {
	bins := build(t)
	e := &env{tb: t, dir: t.TempDir(), serverMembers: sc.serverMembers, clientsTo: sc.clientsTo}
	members := sc.members
	if members == 0 {
		members = 1
	}
	if len(e.serverMembers) == 0 {
		e.serverMembers = []int{0}
	}
	e.cluster = startCluster(t, testkit.EtcdConfig{Bin: bins.etcd, Dir: filepath.Join(e.dir, "etcd"), Members: members,
		Extra: sc.etcdArgs, PeerProxies: sc.peerProxies})
	var err error
	var serverURLs []string
	for i, m := range e.cluster.Members {
		p, err := testkit.NewProxy(fmt.Sprintf("127.0.0.1:%d", m.ClientPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		e.proxies = append(e.proxies, p)
		for _, s := range e.serverMembers {
			switch {
			case s == i && sc.direct:
				serverURLs = append(serverURLs, m.ClientURL())
			case s == i:
				serverURLs = append(serverURLs, p.URL())
			}
		}
	}
	bin, envVars := bins.ours, []string(nil)
	switch {
	case impl == upstream:
		bin = bins.upstream
	case injected != "":
		bin, envVars = bins.oursFaulty, []string{"CACHED_APISERVER_TEST_FAULT=" + injected}
	}
	if impl == ours && sc.failpoints != "" {
		bin, envVars = bins.oursFaulty, append(envVars, inject.FailpointsEnvName+"="+sc.failpoints)
	}
	replicas := max(sc.replicas, 1)
	var addrs []string
	for i := 0; i < replicas; i++ {
		pki := ""
		if i > 0 {
			// Replicas share the CA, serving certificate and admin client
			// certificate, as a Deployment's pods share their Secret.
			pki = filepath.Join(e.dir, "server-0", "pki")
		}
		s := startServer(t, impl, bin, filepath.Join(e.dir, fmt.Sprintf("server-%d", i)), serverURLs, envVars, pki, sc.serverArgs...)
		e.servers = append(e.servers, s)
		addrs = append(addrs, strings.TrimPrefix(s.config.Host, "https://"))
	}
	if replicas > 1 {
		if len(sc.balanced) > 0 {
			var to []string
			for _, i := range sc.balanced {
				to = append(to, addrs[i])
			}
			addrs = to
		}
		if e.balancer, err = testkit.NewBalancer(addrs); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.balancer.Close)
	}
	e.client = e.newClient(sc.writerTo)
	return e
}

func run(t *testing.T, sc scenario, impl, injected string, seed uint64) *result {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &result{scenario: sc.name, server: impl, seed: seed}
	if injected != "" {
		r.server = impl + " (" + injected + " injected)"
	}
	e := setUp(t, sc, impl, injected)
	e.seed = seed
	// The truth begins before the first write, so that it can tell the
	// state at any resourceVersion a list of the server's may carry.
	var err error
	if e.truth, err = startTruth(ctx, e.cluster.truthClient, etcdPrefix); err != nil {
		t.Fatal(err)
	}
	if e.agentTruth, err = startTruth(ctx, e.cluster.truthClient, agentsEtcdPrefix); err != nil {
		t.Fatal(err)
	}
	e.writer = newWriter(e.client, seed)
	if err := e.writer.populate(ctx, populated); err != nil {
		t.Fatalf("populating: %v", err)
	}
	e.oldRV = e.writer.acked.Load()

	// Clients: streams, informers, the lister.
	clientCtx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	e.clientCtx = clientCtx
	e.lists = newListLog()
	// Fifty streams share a connection, as many watches of one informer
	// factory do.
	clients := make([]versioned.Interface, max(10, sc.streams/50))
	for i := range clients {
		clients[i] = e.newClient(sc.clientsTo)
	}
	for i, spec := range streamSpecs(max(sc.streams, 50)) {
		s := newStream(spec, clients[i%len(clients)], e.lists, e.writer.acked.Load)
		e.streams = append(e.streams, s)
		e.clientWG.Add(1)
		go func() {
			defer e.clientWG.Done()
			s.run(clientCtx)
		}()
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, s := range e.streams {
			s.mu.Lock()
			synced := len(s.segments) > 0 && s.segments[0].initial == nil
			s.mu.Unlock()
			if !synced {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("streams never synced: %v", err)
	}
	// The informers start once the streams have synced: 5,000 streams
	// listing at once (the reconnect storm) kept the watch-list informer
	// from syncing within its minute on two cores.
	e.startInformers(t, clientCtx, sc.clientsTo)
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	var trafficWG sync.WaitGroup
	trafficWG.Add(3)
	go func() { defer trafficWG.Done(); e.writer.run(trafficCtx, writeRate) }()
	e.txns = newTxnWriter(e.cluster.client, seed, e.writer.ack)
	go func() { defer trafficWG.Done(); e.txns.run(trafficCtx, txnInterval) }()
	lists := e.newClient(sc.clientsTo)
	go func() { defer trafficWG.Done(); lister(trafficCtx, lists, e.lists, e.writer.acked.Load) }()

	if err := e.waitWrites(ctx, populated+minWritesBeforeFault, 30*time.Second); err != nil {
		t.Fatalf("invalid run: only %d writes went through before the fault", e.writer.succeeded()-populated)
	}

	// The fault, with /readyz watched while it is on.
	faultCtx, faultDone := context.WithCancel(ctx)
	readyzDone := make(chan bool)
	go func() {
		unready := false
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-faultCtx.Done():
				readyzDone <- unready
				return
			case <-tick.C:
				// ctx, not faultCtx: the fault's end must not cancel a probe in flight.
				unready = unready || e.servers[0].readyz(ctx) != 200
			}
		}
	}()
	if err := sc.fault(ctx, e); err != nil {
		t.Fatalf("injecting %s: %v", sc.name, err)
	}
	healed := time.Now()
	faultDone()
	r.notes = append(r.notes, e.notes...)
	r.storm = e.storm
	r.silent = e.silent
	r.soak = e.soak
	r.compactedUnder = e.compactedUnder
	r.unready = <-readyzDone

	atHeal := e.writer.succeeded()
	r.readyAgain = e.readyAgain(ctx, healed)
	for _, s := range e.streams {
		s.settle()
	}
	e.sentinels(ctx, r, healed)
	e.afterHeal(ctx, r, atHeal)
	stopTraffic()
	trafficWG.Wait()
	e.finish(ctx, r)
	stopClients()
	e.clientWG.Wait()
	e.validate(r)
	e.serverMetrics(ctx, r)
	t.Log(r.summary())
	return r
}

// sentinels writes, after the heal, one object into each open stream's
// selector and measures when every stream received its own.
func (e *env) sentinels(ctx context.Context, r *result, healed time.Time) {
	type want struct {
		s *stream
		sentinel
	}
	var wants []want
	bySelector := map[selector]sentinel{}
	for _, s := range e.streams {
		sn, ok := bySelector[s.spec.sel]
		if !ok {
			var err error
			sctx, cancel := context.WithTimeout(ctx, sentinelDeadline)
			sn, err = e.writer.writeSentinel(sctx, s.spec.sel, len(bySelector))
			cancel()
			if err != nil {
				r.notef("%v", err)
				r.undelivered++
				continue
			}
			bySelector[s.spec.sel] = sn
		}
		wants = append(wants, want{s, sn})
	}
	// Each stream gets 5 s after its sentinel's write was acknowledged,
	// and at least until sentinelDeadline+5s after the heal. A write can
	// go through late after a member's restart: the etcd3 store's client
	// (the generic storage factory's, which both servers share) reconnects
	// to it only as gRPC's backoff allows, 1 s growing by 1.6 a time, up
	// to 6 s after a 15 s kill. That is the write path's cost, measured by
	// the recovery's note, not the cache's.
	deadline := healed.Add(sentinelDeadline + 5*time.Second)
	for _, w := range wants {
		if d := w.acked.Add(5 * time.Second); d.After(deadline) {
			deadline = d
		}
	}
	_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Until(deadline), true, func(context.Context) (bool, error) {
		for _, w := range wants {
			if _, ok := w.s.seenAt(w.key); !ok {
				return false, nil
			}
		}
		return true, nil
	})
	var slowest *stream
	for _, w := range wants {
		at, ok := w.s.seenAt(w.key)
		if !ok {
			r.undelivered++
			r.notef("%s never received sentinel %s", w.s.spec.name, w.key)
			continue
		}
		if d := at.Sub(healed); d > r.recovery {
			r.recovery, slowest = d, w.s
		}
		r.sentinelLatency = max(r.sentinelLatency, at.Sub(w.acked))
	}
	if slowest != nil {
		r.notef("last to recover: %s at %v after the heal; %s", slowest.spec.name,
			r.recovery.Round(time.Millisecond), slowest.history(healed))
	}
}

// finish waits for the truth and the informers to reach the last write,
// then compares each informer's store with a fresh list.
func (e *env) finish(ctx context.Context, r *result) {
	last := e.writer.acked.Load()
	for _, t := range []*truth{e.truth, e.agentTruth} {
		if err := t.WaitFor(ctx, e.cluster.truthClient, last, 30*time.Second); err != nil {
			e.tb.Fatalf("the ground truth never reached %d: %v", last, err)
		}
	}
	// A write the writer gave up on when the traffic stopped may still
	// commit after last: each attempt compares with a list made then.
	var fresh *v1beta1.AssignmentList
	relist := func() {
		var err error
		if fresh, err = e.client.FleetV1beta1().Assignments("").List(ctx, metav1.ListOptions{}); err != nil {
			e.tb.Fatalf("final list: %v", err)
		}
		e.lists.add(listResult{who: "final list", rv: parseRV(fresh.ResourceVersion), items: itemsOf(fresh.Items), consistent: true, minRV: last})
	}
	relist()
	e.checkInformers(ctx, r, func() *v1beta1.AssignmentList { relist(); return fresh }, fresh)
}

// startInformers starts the run's two informers, one listing and one by
// watch-list, on replica target, and waits for each to sync.
func (e *env) startInformers(t *testing.T, ctx context.Context, target int) {
	e.informers = []*informer{newInformer("informer (list)", e.newClient(target), false),
		newInformer("informer (watch-list)", e.newClient(target), true)}
	for _, inf := range e.informers {
		if !inf.start(ctx) {
			t.Fatalf("%s never synced", inf.name)
		}
	}
}

// informerSettle is how long after its last failed request an informer's
// store may differ from a fresh list at the end of a run. client-go's
// reflector waits up to 30 s, and a jitter of as much again, before it
// lists again after a failed list: an informer whose lists got 429 all
// through a long fault (the server's member paused for a minute while its
// cache re-listed) lists again up to a minute after the heal, and holds
// what it held until then. An informer none of whose requests failed
// gets informerQuiet, as every informer did before: waiting the minute
// for each made a run whose store is wrong for good (an injected drop)
// take 70 s in make test, not 15.
const (
	informerSettle = 65 * time.Second
	informerQuiet  = 10 * time.Second
)

// informerWait is how long the end of a run waits for inf's store to
// match a fresh list.
func informerWait(inf *informer, now time.Time) time.Duration {
	wait := informerQuiet
	if f := inf.lastFailure(); !f.IsZero() {
		wait = max(wait, f.Add(informerSettle).Sub(now))
	}
	return wait
}

// checkInformers compares each informer's store with fresh, listing again
// through relist while they differ, for up to informerWait each, and
// counts the informers' re-lists and the transactions written beside the
// server.
func (e *env) checkInformers(ctx context.Context, r *result, relist func() *v1beta1.AssignmentList, fresh *v1beta1.AssignmentList) {
	// The informers settle at once: each wait counts from the check's start.
	start := time.Now()
	for _, inf := range e.informers {
		left := max(start.Add(informerWait(inf, start)).Sub(time.Now()), 0)
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, left, true, func(context.Context) (bool, error) {
			if d, _ := watchcheck.Diff(itemsOf(fresh.Items), inf.items()); d == "" {
				return true, nil
			}
			fresh = relist()
			d, _ := watchcheck.Diff(itemsOf(fresh.Items), inf.items())
			return d == "", nil
		}); err != nil {
			d, _ := watchcheck.Diff(itemsOf(fresh.Items), inf.items())
			r.Note(&r.Lists, "%s: store differs from a fresh list at %s: %s", inf.name, fresh.ResourceVersion, d)
		}
		r.relists += inf.relists()
	}
	txns, failed := e.txns.counts()
	r.notef("%d transactions and agents written beside the server; failed: %v", txns, failed)
}

// truthOf returns the truth of sel's resource.
func (e *env) truthOf(sel selector) *truth {
	if sel.resource == agentsRes {
		return e.agentTruth
	}
	return e.truth
}

// validate checks every stream and list against the truth.
func (e *env) validate(r *result) {
	check := func(s *stream, probe bool) {
		m, err := newMatcher(s.spec.sel)
		if err != nil {
			e.tb.Fatal(err)
		}
		changes, err := e.changesOf(s.spec.sel)
		if err != nil {
			e.tb.Fatalf("the ground truth is incomplete: %v", err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, seg := range s.segments {
			if seg.initial != nil {
				continue // a watch-list that never completed its state: nothing to check
			}
			r.Add(watchcheck.CheckSegment(s.spec.name, changes, m.matches, seg.check()))
		}
		for _, end := range s.ends {
			switch {
			case probe:
				r.probes++
				if end.reason == end410 {
					r.probes410++
				}
			case end.timedOut():
				r.timedOut++
			case end.reason == end410 && end.from < e.cluster.compactions.before(end.at):
				// etcd compacted past where it resumed: etcd's own answer.
				r.compacted410++
			case end.reason == end410:
				r.ended410++
				r.notef("%s ended with %s, resuming from %d", s.spec.name, end.msg, end.from)
			case end.reason == endError:
				r.endedError++
				r.notef("%s ended with %s", s.spec.name, end.msg)
			case end.reason == endClosed:
				r.endedClosed++
				if s.spec.bookmarks && end.empty {
					r.closedEmpty++
				}
			}
		}
		if !probe {
			r.relists += s.relists
		}
	}
	for _, s := range e.streams {
		check(s, false)
	}
	for _, s := range e.probes {
		check(s, true)
	}
	e.lists.mu.Lock()
	defer e.lists.mu.Unlock()
	for _, l := range e.lists.lists {
		m, err := newMatcher(l.sel)
		if err != nil {
			e.tb.Fatal(err)
		}
		list := watchcheck.List{Who: l.who, Rev: l.rv, Items: l.items}
		if l.consistent {
			list.MinRev = l.minRV
		}
		r.Add(e.checkList(l.sel, m, list))
	}
	for what, n := range e.lists.errors {
		r.listErrors += n
		r.notef("%d × %s failed, first with: %s", n, what, e.lists.firstErr[what])
		switch {
		case strings.HasPrefix(what, "list at 0 "):
			r.staleReadErrors += n
		case !strings.HasSuffix(what, " 429") && !strings.HasSuffix(what, " 503") && !strings.HasSuffix(what, " 504") &&
			!strings.HasSuffix(what, " 410"): // a continue token compacted away
			r.unclearErrors += n
		}
	}
	r.writesOK = e.writer.succeeded()
	e.writer.mu.Lock()
	for what, n := range e.writer.failed {
		r.writesFailed += n
		r.notef("%d × write %s failed", n, what)
	}
	e.writer.mu.Unlock()
	for _, s := range e.servers {
		r.Add(s.checkReadiness())
	}
}

// afterHeal waits for the writes to resume past atHeal, the writes that
// had succeeded at the heal, and adds the liveness check's result, if the
// fault started one: what both harnesses do once etcd is healed.
func (e *env) afterHeal(ctx context.Context, r *result, atHeal int) {
	if err := e.waitWrites(ctx, atHeal+writesAfterHeal, resumeBound); err != nil {
		r.writesStalled = true
		r.notef("writes did not resume within %v of the heal", resumeBound)
	}
	if e.liveness != nil {
		l := <-e.liveness
		r.Add(l.Violations)
		r.notes = append(r.notes, l.notes...)
		r.harnessErrors = append(r.harnessErrors, l.harnessErrors...)
	}
}

// resumeBound is how long after the heal /readyz may fail and writes may
// not go through before the scenario fails.
const resumeBound = 30 * time.Second

// readyAgain returns how long after the heal the first server's /readyz
// answered 200, or resumeBound+1s if it did not within resumeBound. A
// server that is not running (a replica lost for good) is not asked.
//
// It asks /readyz alone, and records no start: the server did not start
// again (each restart waits for its own start, with its lists). /readyz
// stays 200 through an outage by design, a re-list does not make it fail,
// while a consistent list waits for etcd (the liveness check's lists,
// allowed etcdHealthyFor after the heal). Recorded as a start, a list sent
// then and refused, because the server's connection to a restarted member
// was still in gRPC's reconnect backoff, read as a readiness violation.
func (e *env) readyAgain(ctx context.Context, healed time.Time) time.Duration {
	s := e.servers[0]
	if !s.proc.Running() {
		return 0
	}
	ctx, cancel := context.WithDeadline(ctx, healed.Add(resumeBound))
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, readinessPoll, true, func(ctx context.Context) (bool, error) {
		return s.readyz(ctx) == http.StatusOK, nil
	})
	if err != nil {
		if !s.proc.Running() {
			return 0
		}
		return resumeBound + time.Second
	}
	return time.Since(healed)
}

// serverMetrics reads the servers' cache re-lists, re-watches and failed
// consistency checks, summed over the replicas still running, and notes
// the events ours dropped as repeated.
//
// A scrape that fails, or a metric that is missing, is a harness error,
// which fails the scenario: read as 0 it would pass every assertion on it.
// Upstream's cache serves no consistency-check or re-watch counts.
func (e *env) serverMetrics(ctx context.Context, r *result) {
	read := func(s *apiServer, name string, labels ...string) int {
		v, err := s.metric(ctx, name, labels...)
		if err != nil {
			r.harnessErrors = append(r.harnessErrors, fmt.Sprintf("reading %s's metrics: %v", s.proc.Name(), err))
		}
		return int(v)
	}
	for _, s := range e.servers {
		if !s.proc.Running() {
			continue
		}
		r.cacheRelists += max(read(s, "apiserver_watch_cache_initializations_total", `resource="assignments"`)-1, 0)
		if s.impl == ours {
			r.checksFailed += read(s, "apiserver_storage_consistency_checks_total", `resource="assignments"`, `status="failure"`)
			r.cacheRewatches += read(s, "cached_apiserver_watch_cache_etcd_watch_restarts_total", `resource="assignments"`)
			if n := read(s, "cached_apiserver_watch_cache_replayed_events_total", `resource="assignments"`); n > 0 {
				r.notes = append(r.notes, fmt.Sprintf("%s dropped %d events etcd's client delivered again (etcd-io/etcd#20221)", s.proc.Name(), n))
			}
		}
	}
}
