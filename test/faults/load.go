package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
	fleetscheme "github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned/scheme"
)

// Issue 65, item 5: the chaos scenarios under the load our users run.
// Agents each watch their own Assignment (fieldSelector metadata.name=…),
// controllers watch a namespace or everything, some of them slowly, and
// transactions straight to etcd write among the watched objects beside the
// writes through the API. Every stream is checked against etcd's history
// as in every scenario (validate); beside that, per stream, how long after
// the heal it received a write made after it, and the server's RSS.

// loadConfig is the load of a run.
type loadConfig struct {
	// objects is how many Assignments are put in etcd before the clients
	// start, and how many single-object watchers watch them, one each.
	objects int
	// namespaces spreads the objects; one watcher watches each namespace.
	namespaces int
	// everything is how many watchers watch every Assignment; the first
	// slow of them consume slowly (slowPauses).
	everything, slow int
	// rate is object writes a second: writeRate through the API, the rest
	// in transactions of the objects straight to etcd.
	rate int
}

// fullLoad is the issue's: 20,000 streams and 100 writes a second.
var fullLoad = loadConfig{objects: 20_000, namespaces: 100, everything: 10, slow: 3, rate: 100}

// ciLoad is make test's: a tenth of the streams at the same rate, within
// a minute on two cores.
var ciLoad = loadConfig{objects: 2_000, namespaces: 100, everything: 10, slow: 3, rate: 100}

const (
	// loadStreamsPerConn is how many streams share a client's HTTP/2
	// connection: the generic server's SETTINGS_MAX_CONCURRENT_STREAMS
	// without --http2-max-streams-per-connection (k8s.io/apiserver's
	// secure_serving.go), which a client behind the kube-aggregator meets.
	// client-go's transport dials another connection when one is full.
	loadStreamsPerConn = 100
	// poolTxnMin and poolTxnMax bound a transaction's keys: 8 on average.
	poolTxnMin, poolTxnMax = 2, 14
	// poolDeleteOneIn is how often a key of a transaction is deleted
	// rather than updated: a single-object watcher then sees its object go,
	// and come back when a later transaction puts it.
	poolDeleteOneIn = 10
	// putChunk is the keys of one transaction that puts many: etcd's
	// default --max-txn-ops.
	putChunk = 128
	// putWorkers is how many such transactions are in flight at once.
	putWorkers = 8
	// loadOpenBatch is how many streams start at once, as a fleet's
	// agents start in waves (runLoad).
	loadOpenBatch = 500
	// loadListEvery is how often the load's lister lists.
	loadListEvery = 500 * time.Millisecond
)

// informerBackoff is client-go's reflector's backoff between failed
// watches (tools/cache/reflector.go): 800 ms doubling to 30 s, jittered.
// With the harness's 1 s cap, 20,000 streams re-opening after a restart
// asked for 20,000 watches a second on the two cores the restarted server
// and etcd need.
var informerBackoff = wait.Backoff{Duration: 800 * time.Millisecond, Factor: 2, Jitter: 1, Steps: 1 << 30, Cap: 30 * time.Second}

// slowPauses are the slow consumers' time over each event: a stream of
// everything gets 100 events a second in the steady state, which even
// the slowest keeps up with. The 20,000 sentinels after the heal put it
// 20 to 60 s behind, inside the cache's history window (75 s).
var slowPauses = []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}

// loadNamespace is the i-th namespace of the load.
func loadNamespace(i int) string { return fmt.Sprintf("load-%03d", i) }

// keys returns the objects' namespace/name, in order.
func (c loadConfig) keys() []string {
	keys := make([]string, c.objects)
	for i := range keys {
		keys[i] = loadNamespace(i%c.namespaces) + "/" + fmt.Sprintf("agent-%05d", i)
	}
	return keys
}

// txnInterval is how often the transaction writer writes, so that its
// keys and the API writer's writes make c.rate a second.
func (c loadConfig) txnInterval() time.Duration {
	keysPerSecond := float64(max(c.rate-writeRate, 1))
	return time.Duration(float64(time.Second) * float64(poolTxnMin+poolTxnMax) / 2 / keysPerSecond)
}

// streamSpecs are the load's raw watch clients: a single-object watcher
// per object, one on each namespace, and the watchers of everything. As
// informers do, they ask for bookmarks, and one in ten syncs by
// watch-list.
func (c loadConfig) streamSpecs() []watchSpec {
	var specs []watchSpec
	for i, key := range c.keys() {
		ns, name, _ := strings.Cut(key, "/")
		specs = append(specs, watchSpec{name: fmt.Sprintf("n%05d %s", i, key), sel: nameSelector(ns, name),
			bookmarks: true, watchList: i%10 == 9})
	}
	for i := range c.namespaces {
		ns := loadNamespace(i)
		specs = append(specs, watchSpec{name: fmt.Sprintf("ns%03d %s", i, ns), sel: selector{namespace: ns},
			bookmarks: i%2 == 0, watchList: i%10 == 9})
	}
	for i := range c.everything {
		spec := watchSpec{name: fmt.Sprintf("all%02d", i), bookmarks: i%2 == 0, watchList: i == c.everything-1}
		if i < c.slow {
			spec.pause = slowPauses[i%len(slowPauses)]
			spec.name += fmt.Sprintf(" slow %v", spec.pause)
		}
		specs = append(specs, spec)
	}
	for i := range specs {
		specs[i].retry = &informerBackoff
	}
	return specs
}

// Bounds of a server restart under load: with 20,000 streams open,
// upstream took more than a minute to exit after SIGTERM.
const (
	loadExitBound  = 3 * time.Minute
	loadReadyBound = 5 * time.Minute
)

// restartUnderLoad is serverRestart with loadExitBound and loadReadyBound.
func restartUnderLoad(ctx context.Context, e *env) error {
	s := e.servers[0]
	if err := s.proc.Terminate(loadExitBound); err != nil {
		return err
	}
	if err := s.proc.Start(); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, loadReadyBound)
	defer cancel()
	return s.waitReady(rctx, "")
}

// poolTxn writes 2–14 keys of the pool in one transaction: mostly puts,
// which move them between label and field selectors, and a tenth deletes.
func (w *txnWriter) poolTxn(ctx context.Context) error {
	w.mu.Lock()
	n := min(poolTxnMin+w.rng.IntN(poolTxnMax-poolTxnMin+1), len(w.pool))
	ops := make([]clientv3.Op, 0, n)
	used := map[int]bool{}
	for len(ops) < n {
		i := w.rng.IntN(len(w.pool))
		if used[i] {
			continue
		}
		used[i] = true
		key := w.pool[i]
		if w.rng.IntN(poolDeleteOneIn) == 0 {
			ops = append(ops, clientv3.OpDelete(etcdPrefix+key))
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		v, err := w.assignment(ns, name)
		if err != nil {
			w.mu.Unlock()
			return err
		}
		ops = append(ops, clientv3.OpPut(etcdPrefix+key, v))
	}
	w.mu.Unlock()
	tctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	resp, err := w.client.Txn(tctx).Then(ops...).Commit()
	if err != nil {
		return err // it may have committed all the same: the truth says
	}
	w.ack(resp.Header.Revision)
	return nil
}

// values returns what the servers store for each of keys, with a random
// tier, agent and phase.
func (w *txnWriter) values(keys []string) ([]string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, len(keys))
	for i, key := range keys {
		ns, name, _ := strings.Cut(key, "/")
		var err error
		if out[i], err = w.assignment(ns, name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// committed is when a put of putAll committed, and at which revision.
type committed struct {
	rev int64
	at  time.Time
}

// putAll puts each key's value straight into etcd, putChunk keys a
// transaction, putWorkers transactions at once, each retried until it
// commits or timeout has passed: right after a heal etcd may still be
// electing. It returns each key's commit.
func putAll(ctx context.Context, client *clientv3.Client, keys, values []string, timeout time.Duration) (map[string]committed, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := make(map[string]committed, len(keys))
	var mu sync.Mutex // guards out and firstErr
	var firstErr error
	chunks := make(chan int)
	var wg sync.WaitGroup
	for range putWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := range chunks {
				to := min(from+putChunk, len(keys))
				ops := make([]clientv3.Op, 0, to-from)
				for i := from; i < to; i++ {
					ops = append(ops, clientv3.OpPut(etcdPrefix+keys[i], values[i]))
				}
				var resp *clientv3.TxnResponse
				err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
					tctx, cancel := context.WithTimeout(ctx, writeTimeout)
					defer cancel()
					var err error
					resp, err = client.Txn(tctx).Then(ops...).Commit()
					return err == nil, nil
				})
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("putting %s…: %w", keys[from], err)
				}
				if err == nil {
					for i := from; i < to; i++ {
						out[keys[i]] = committed{rev: resp.Header.Revision, at: time.Now()}
					}
				}
				mu.Unlock()
			}
		}()
	}
	for from := 0; from < len(keys); from += putChunk {
		chunks <- from
	}
	close(chunks)
	wg.Wait()
	return out, firstErr
}

// loadLister lists one namespace at a time, in the three ways clients do,
// and every fourth time all agents, until ctx ends: lister's rounds,
// without lists of all 20,000 objects five times a second, which would
// hold a core of the test's own.
func loadLister(ctx context.Context, client versioned.Interface, log *listLog, acked func() int64, namespaces int) {
	rc := client.FleetV1beta1().RESTClient()
	tick := time.NewTicker(loadListEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ns := loadNamespace(i / 4 % namespaces)
		sel := selector{namespace: ns}
		list := func(rctx context.Context, opts metav1.ListOptions) (*v1beta1.AssignmentList, error) {
			out := &v1beta1.AssignmentList{}
			err := rc.Get().Namespace(ns).Resource("assignments").VersionedParams(&opts, fleetscheme.ParameterCodec).
				MaxRetries(0).Do(rctx).Into(out)
			return out, err
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lists := failures{log, ctx}
		switch i % 4 {
		case 0:
			minRV := acked()
			if l, err := list(rctx, metav1.ListOptions{}); err != nil {
				lists.fail("consistent list", err)
			} else {
				lists.add(listResult{who: "lister (consistent, " + ns + ")", sel: sel, rv: parseRV(l.ResourceVersion),
					items: itemsOf(l.Items), consistent: true, minRV: minRV})
			}
		case 1:
			if l, err := list(rctx, metav1.ListOptions{ResourceVersion: "0"}); err != nil {
				lists.fail("list at 0", err)
			} else {
				lists.add(listResult{who: "lister (resourceVersion 0, " + ns + ")", sel: sel, rv: parseRV(l.ResourceVersion),
					items: itemsOf(l.Items)})
			}
		case 2:
			minRV := acked()
			opts := metav1.ListOptions{Limit: 25}
			items := map[string]int64{}
			var rv int64
			for {
				l, err := list(rctx, opts)
				if err != nil {
					lists.fail("paged list", err)
					break
				}
				for k, v := range itemsOf(l.Items) {
					items[k] = v
				}
				if rv == 0 {
					rv = parseRV(l.ResourceVersion)
				}
				if l.Continue == "" {
					lists.add(listResult{who: "lister (pages of 25, " + ns + ")", sel: sel, rv: rv, items: items,
						consistent: true, minRV: minRV})
					break
				}
				opts.Continue = l.Continue
			}
		case 3:
			minRV := acked()
			out := &v1beta1.AgentList{}
			if err := rc.Get().Resource("agents").MaxRetries(0).Do(rctx).Into(out); err != nil {
				lists.fail("consistent list of agents", err)
			} else {
				items := map[string]int64{}
				for _, a := range out.Items {
					items[a.Name] = parseRV(a.ResourceVersion)
				}
				lists.add(listResult{who: "lister (agents)", sel: selector{resource: agentsRes}, rv: parseRV(out.ResourceVersion),
					items: items, consistent: true, minRV: minRV})
			}
		}
		cancel()
	}
}
