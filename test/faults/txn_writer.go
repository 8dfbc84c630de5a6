package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// txnWriter writes straight to etcd beside the servers, as another writer
// of their prefixes: transactions that create, update and delete 2–12 of
// its own assignments in one revision, over every selector the streams
// use, and now and then an agent, so that the idle resource moves too.
// etcd gives one revision to every key of a transaction: the shape that
// lost events on live streams before issue 56.
type txnWriter struct {
	client *clientv3.Client
	rng    *rand.Rand
	// ack records a revision a write was acknowledged at.
	ack func(int64)
	// pool, when set, holds the keys (namespace/name) its transactions
	// write instead of its own: objects that single-object watchers watch
	// (poolTxn). Set before run.
	pool []string

	// mu guards the fields below.
	mu     sync.Mutex
	live   []string // namespace/name of the writer's assignments
	next   int
	agents int
	ok     int
	failed map[string]int
}

// txnAgentEvery is how many transactions the writer makes between agents.
const txnAgentEvery = 20

func newTxnWriter(client *clientv3.Client, seed uint64, ack func(int64)) *txnWriter {
	return &txnWriter{client: client, rng: rand.New(rand.NewPCG(seed, 7)), ack: ack, failed: map[string]int{}}
}

// run writes a transaction every interval until ctx ends. Failures during
// a fault are counted and the writer goes on: what counts is what etcd
// recorded, which the truth reads.
func (w *txnWriter) run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		what, err := "transaction", w.txn(ctx)
		if i%txnAgentEvery == 0 && err == nil {
			what, err = "agent", w.agent(ctx)
		}
		w.mu.Lock()
		if err != nil && ctx.Err() == nil {
			w.failed[what]++
		} else if err == nil {
			w.ok++
		}
		w.mu.Unlock()
	}
}

// txn writes 2–12 of the writer's assignments in one transaction.
func (w *txnWriter) txn(ctx context.Context) error {
	if len(w.pool) > 0 {
		return w.poolTxn(ctx)
	}
	w.mu.Lock()
	n := 2 + w.rng.IntN(11)
	var ops []clientv3.Op
	var created, deleted []string
	used := map[string]bool{}
	for range n {
		i := w.rng.IntN(len(w.live) + 1)
		switch {
		case i < len(w.live) && !used[w.live[i]] && w.rng.IntN(2) == 0:
			key := w.live[i]
			used[key] = true
			deleted = append(deleted, key)
			ops = append(ops, clientv3.OpDelete(etcdPrefix+key))
		case i < len(w.live) && !used[w.live[i]]:
			key := w.live[i]
			used[key] = true
			ns, name, _ := strings.Cut(key, "/")
			v, err := w.assignment(ns, name)
			if err != nil {
				w.mu.Unlock()
				return err
			}
			ops = append(ops, clientv3.OpPut(etcdPrefix+key, v))
		default:
			w.next++
			ns, name := namespaces[w.rng.IntN(len(namespaces))], fmt.Sprintf("txn-%05d", w.next)
			v, err := w.assignment(ns, name)
			if err != nil {
				w.mu.Unlock()
				return err
			}
			created = append(created, ns+"/"+name)
			ops = append(ops, clientv3.OpPut(etcdPrefix+ns+"/"+name, v))
		}
	}
	w.mu.Unlock()
	tctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	resp, err := w.client.Txn(tctx).Then(ops...).Commit()
	if err != nil {
		// It may have committed all the same: the truth says. The writer
		// forgets the keys either way, so that it never writes one it
		// believes deleted.
		w.forget(append(created, deleted...))
		return err
	}
	w.mu.Lock()
	w.live = append(w.live, created...)
	w.mu.Unlock()
	w.forget(deleted)
	w.ack(resp.Header.Revision)
	return nil
}

func (w *txnWriter) forget(keys []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.live = slices.DeleteFunc(w.live, func(k string) bool { return slices.Contains(keys, k) })
}

// agent puts one new agent.
func (w *txnWriter) agent(ctx context.Context) error {
	w.mu.Lock()
	w.agents++
	a := v1beta1.Agent{TypeMeta: metav1.TypeMeta{Kind: "Agent", APIVersion: v1beta1.SchemeGroupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("txn-agent-%03d", w.agents), UID: types.UID(fmt.Sprintf("txn-agent-%d", w.agents)),
			CreationTimestamp: metav1.Now()},
		Spec: v1beta1.AgentSpec{Zone: []string{"zone-a", "zone-b"}[w.rng.IntN(2)]}}
	w.mu.Unlock()
	v, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	resp, err := w.client.Put(tctx, agentsEtcdPrefix+a.Name, string(v))
	if err != nil {
		return err
	}
	w.ack(resp.Header.Revision)
	return nil
}

// assignment is what the servers store for an assignment of the writer's,
// with a random tier, agent and phase: their storage version's JSON.
// Callers hold w.mu.
func (w *txnWriter) assignment(ns, name string) (string, error) {
	a := v1beta1.Assignment{TypeMeta: metav1.TypeMeta{Kind: "Assignment", APIVersion: v1beta1.SchemeGroupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("txn-" + ns + "-" + name),
			CreationTimestamp: metav1.Now(), Labels: map[string]string{"tier": tiers[w.rng.IntN(len(tiers))]}},
		Spec:   v1beta1.AssignmentSpec{AgentName: agents[w.rng.IntN(len(agents))]},
		Status: v1beta1.AssignmentStatus{Phase: phases[w.rng.IntN(len(phases))]}}
	v, err := json.Marshal(a)
	return string(v), err
}

// counts returns the transactions and agents written, and the failures.
func (w *txnWriter) counts() (ok int, failed map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ok, maps.Clone(w.failed)
}
