package cacher

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
)

// The traffic of a robustness run: writes through the etcd3 store, as the
// API server makes them, and writes straight to etcd beside it, as another
// writer of the prefix: transactions over many keys, and objects on leases
// that expire with many keys on them. Both give one etcd revision to
// several events. Then idle spells, compactions, and restarts of the
// caches. Every choice comes from the run's seed.

// rbOp is one kind of traffic step.
type rbOp int

const (
	opCreate rbOp = iota
	opUpdate
	opDelete
	// opTxn writes 2–16 keys of the busy resource in one transaction:
	// creates, updates and deletions.
	opTxn
	// opLease puts 2–16 new objects on one lease of 2 s: its expiry
	// deletes them in one revision.
	opLease
	// opStoreTTL creates an object with a TTL of a second through the
	// etcd3 store, on a lease of its own.
	opStoreTTL
	// opIdle writes nothing for 0.1–1.5 s.
	opIdle
	// opIdleWrite writes the idle resource once.
	opIdleWrite
	// opCompact compacts etcd at its current revision.
	opCompact
	// opRestart restarts every cache of one resource, as a server restart.
	opRestart
	// opRestartIdle restarts every cache of the idle resource.
	opRestartIdle
	numOps
)

var opNames = [numOps]string{"create", "update", "delete", "txn", "lease", "store-ttl", "idle", "idle-write", "compact", "restart",
	"restart-idle"}

// rbWriter makes a run's traffic.
type rbWriter struct {
	env *rbEnv
	rnd *rand.Rand
	// prelude are the first steps; weights choose the others, by rbOp.
	prelude []rbOp
	weights [numOps]int
	// acked is the newest revision a write was acknowledged at; compacted
	// the newest compaction, and compactions when each happened.
	acked atomic.Int64

	// mu guards compactions, live, leased, next and done.
	mu          sync.Mutex
	compactions []rbCompaction
	// live holds the keys of each resource's objects the writer may update
	// or delete: not those on a lease, which expire on their own.
	live map[*rbResource][]string
	// leased holds the etcd keys of the objects put on leases.
	leased []string
	next   int
	// done counts the steps taken, by kind.
	done [numOps]int
}

// rbCompaction is a compaction: at revision rev, done at time at.
type rbCompaction struct {
	rev int64
	at  time.Time
}

func newRBWriter(env *rbEnv, seed uint64, p rbProfileSpec) *rbWriter {
	return &rbWriter{env: env, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), prelude: p.prelude, weights: p.weights,
		live: map[*rbResource][]string{}}
}

// run takes steps until ctx ends or d passes, about one every 10 ms.
func (w *rbWriter) run(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	total := 0
	for _, n := range w.weights {
		total += n
	}
	for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
		var op rbOp
		if i < len(w.prelude) {
			op = w.prelude[i]
		} else {
			pick := w.rnd.IntN(total)
			for ; pick >= w.weights[op]; op++ {
				pick -= w.weights[op]
			}
		}
		if err := w.step(ctx, op); err != nil {
			return fmt.Errorf("%s: %w", opNames[op], err)
		}
		w.mu.Lock()
		w.done[op]++
		w.mu.Unlock()
		time.Sleep(time.Duration(5+w.rnd.IntN(10)) * time.Millisecond) // the traffic's own pace
	}
	return nil
}

// step takes one step of kind op.
func (w *rbWriter) step(ctx context.Context, op rbOp) error {
	busy, idle := w.env.resources[0], w.env.resources[1]
	switch op {
	case opCreate:
		return w.create(ctx, busy, 0)
	case opUpdate:
		return w.update(ctx, busy)
	case opDelete:
		return w.delete(ctx, busy)
	case opTxn:
		return w.txn(ctx, busy, 2+w.rnd.IntN(15))
	case opLease:
		return w.lease(ctx, busy, 2+w.rnd.IntN(15))
	case opStoreTTL:
		return w.create(ctx, busy, 1)
	case opIdle:
		time.Sleep(time.Duration(100+w.rnd.IntN(1400)) * time.Millisecond) // the idle spell is the traffic
		return nil
	case opIdleWrite:
		if w.rnd.IntN(2) == 0 {
			return w.create(ctx, idle, 0)
		}
		return w.update(ctx, idle)
	case opCompact:
		return w.compact(ctx)
	case opRestart:
		return w.restart(w.env.resources[w.rnd.IntN(len(w.env.resources))])
	case opRestartIdle:
		return w.restart(idle)
	}
	return nil
}

// restart restarts every cache of r.
func (w *rbWriter) restart(r *rbResource) error {
	for _, impl := range rbImpls {
		if err := r.caches[impl].restart(w.acked.Load()); err != nil {
			return err
		}
	}
	return nil
}

// pod returns a new pod of the writer's, with a random tier and node.
func (w *rbWriter) pod() *example.Pod {
	w.mu.Lock()
	w.next++
	name := fmt.Sprintf("p%05d", w.next)
	w.mu.Unlock()
	return &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"tier": w.tier()}},
		Spec: example.PodSpec{NodeName: w.node()}}
}

func (w *rbWriter) tier() string { return []string{"gold", "silver"}[w.rnd.IntN(2)] }
func (w *rbWriter) node() string { return fmt.Sprintf("node-%d", w.rnd.IntN(3)) }

// ack records a write acknowledged at revision rev.
func (w *rbWriter) ack(rev int64) {
	for {
		old := w.acked.Load()
		if rev <= old || w.acked.CompareAndSwap(old, rev) {
			return
		}
	}
}

// ackObject records a write through the store, whose result is out.
func (w *rbWriter) ackObject(out runtime.Object) error {
	rv, err := storage.APIObjectVersioner{}.ObjectResourceVersion(out)
	if err != nil {
		return err
	}
	w.ack(int64(rv))
	return nil
}

// create creates a pod through the store, with ttl seconds to live if
// not 0.
func (w *rbWriter) create(ctx context.Context, r *rbResource, ttl uint64) error {
	pod := w.pod()
	out := &example.Pod{}
	if err := r.store.Create(ctx, r.prefix+"ns/"+pod.Name, pod, out, ttl); err != nil {
		return err
	}
	w.mu.Lock()
	if ttl == 0 {
		w.live[r] = append(w.live[r], pod.Name)
	} else {
		w.leased = append(w.leased, r.etcdPrefix+"ns/"+pod.Name)
	}
	w.mu.Unlock()
	return w.ackObject(out)
}

// pickLive takes a random live key of r, removing it if remove.
func (w *rbWriter) pickLive(r *rbResource, remove bool) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	names := w.live[r]
	if len(names) == 0 {
		return "", false
	}
	i := w.rnd.IntN(len(names))
	name := names[i]
	if remove {
		w.live[r] = slices.Delete(names, i, i+1)
	}
	return name, true
}

// update moves a live pod of r to a random tier and node.
func (w *rbWriter) update(ctx context.Context, r *rbResource) error {
	name, ok := w.pickLive(r, false)
	if !ok {
		return w.create(ctx, r, 0)
	}
	tier, node := w.tier(), w.node()
	out := &example.Pod{}
	err := r.store.GuaranteedUpdate(ctx, r.prefix+"ns/"+name, out, false, nil,
		func(in runtime.Object, _ storage.ResponseMeta) (runtime.Object, *uint64, error) {
			pod := in.(*example.Pod).DeepCopy()
			pod.Labels = map[string]string{"tier": tier}
			pod.Spec.NodeName = node
			return pod, nil, nil
		}, nil)
	if err != nil {
		return err
	}
	return w.ackObject(out)
}

// delete deletes a live pod of r.
func (w *rbWriter) delete(ctx context.Context, r *rbResource) error {
	name, ok := w.pickLive(r, true)
	if !ok {
		return nil
	}
	out := &example.Pod{}
	if err := r.store.Delete(ctx, r.prefix+"ns/"+name, out, nil, storage.ValidateAllObjectFunc, nil, storage.DeleteOptions{}); err != nil {
		return err
	}
	// A deletion is acknowledged at a revision its result does not carry.
	rev, err := r.store.GetCurrentResourceVersion(ctx)
	if err != nil {
		return err
	}
	w.ack(int64(rev))
	return nil
}

// storedValue is what the etcd3 store keeps for pod: its bytes in the storage
// codec, without a resourceVersion.
func storedValue(pod *example.Pod) (string, error) {
	var buf bytes.Buffer
	if err := rbCodec.Encode(pod, &buf); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// txn writes n keys of r in one transaction, straight to etcd: new pods,
// and updates and deletions of live ones.
func (w *rbWriter) txn(ctx context.Context, r *rbResource, n int) error {
	var ops []clientv3.Op
	var created []string
	seen := map[string]bool{}
	for range n {
		switch name, ok := w.pickLive(r, false); {
		case ok && !seen[name] && w.rnd.IntN(3) == 0:
			seen[name] = true
			w.removeLive(r, name)
			ops = append(ops, clientv3.OpDelete(r.etcdPrefix+"ns/"+name))
		case ok && !seen[name] && w.rnd.IntN(2) == 0:
			seen[name] = true
			pod := w.pod()
			pod.Name = name
			v, err := storedValue(pod)
			if err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(r.etcdPrefix+"ns/"+name, v))
		default:
			pod := w.pod()
			v, err := storedValue(pod)
			if err != nil {
				return err
			}
			created = append(created, pod.Name)
			ops = append(ops, clientv3.OpPut(r.etcdPrefix+"ns/"+pod.Name, v))
		}
	}
	resp, err := w.env.client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.live[r] = append(w.live[r], created...)
	w.mu.Unlock()
	w.ack(resp.Header.Revision)
	return nil
}

func (w *rbWriter) removeLive(r *rbResource, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := slices.Index(w.live[r], name); i >= 0 {
		w.live[r] = slices.Delete(w.live[r], i, i+1)
	}
}

// leaseTTL is the TTL of opLease's leases: etcd's shortest lease lives
// about 1.5 s with its default election timeout.
const leaseTTL = 2

// lease puts n new pods of r on one lease, in one transaction.
func (w *rbWriter) lease(ctx context.Context, r *rbResource, n int) error {
	lease, err := w.env.client.Grant(ctx, leaseTTL)
	if err != nil {
		return err
	}
	var ops []clientv3.Op
	var keys []string
	for range n {
		pod := w.pod()
		v, err := storedValue(pod)
		if err != nil {
			return err
		}
		keys = append(keys, r.etcdPrefix+"ns/"+pod.Name)
		ops = append(ops, clientv3.OpPut(keys[len(keys)-1], v, clientv3.WithLease(lease.ID)))
	}
	w.mu.Lock()
	w.leased = append(w.leased, keys...)
	w.mu.Unlock()
	resp, err := w.env.client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return err
	}
	w.ack(resp.Header.Revision)
	return nil
}

// waitExpired waits until etcd has deleted every object the writer put on
// a lease, and acknowledges the deletions.
func (w *rbWriter) waitExpired(ctx context.Context) error {
	w.mu.Lock()
	keys := slices.Clone(w.leased)
	w.mu.Unlock()
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, k := range keys {
			resp, err := w.env.client.Get(ctx, k, clientv3.WithCountOnly())
			if err != nil {
				return false, err
			}
			if resp.Count > 0 {
				return false, nil
			}
			w.ack(resp.Header.Revision)
		}
		return true, nil
	})
}

// compact compacts etcd at its current revision, and tells the stores'
// compactors, as etcd3's compactor learns of a compaction another server
// made.
func (w *rbWriter) compact(ctx context.Context) error {
	resp, err := w.env.client.Get(ctx, "compact-probe")
	if err != nil {
		return err
	}
	rev := resp.Header.Revision
	if rev <= w.compactedBefore(time.Now()) {
		return nil // nothing written since the last one
	}
	// Recorded as of the request: a client may see its effect before it returns.
	at := time.Now()
	if _, err := w.env.client.Compact(ctx, rev); err != nil {
		return err
	}
	for _, r := range w.env.resources {
		r.compactorsMu.Lock()
		for _, c := range r.compactors {
			c.UpdateCompactRevision(rev)
		}
		r.compactorsMu.Unlock()
	}
	w.mu.Lock()
	w.compactions = append(w.compactions, rbCompaction{rev: rev, at: at})
	w.mu.Unlock()
	return nil
}

// compactedBefore returns the newest compaction done before t, 0 if none.
func (w *rbWriter) compactedBefore(t time.Time) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var rev int64
	for _, c := range w.compactions {
		if c.at.Before(t) {
			rev = max(rev, c.rev)
		}
	}
	return rev
}

// steps says how many steps of each kind the writer took.
func (w *rbWriter) steps() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for op, n := range w.done {
		if n > 0 {
			out = append(out, fmt.Sprintf("%s %d", opNames[op], n))
		}
	}
	return fmt.Sprint(out)
}
