package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// The objects the writer spreads its writes over, so that every kind of
// selector sees objects enter, change in and leave it.
var (
	namespaces = []string{"faults-a", "faults-b"}
	agents     = []string{"agent-0", "agent-1", "agent-2", "agent-3", "agent-4"}
	tiers      = []string{"gold", "silver"}
	phases     = []v1beta1.AssignmentPhase{v1beta1.AssignmentPending, v1beta1.AssignmentRunning, v1beta1.AssignmentSucceeded, v1beta1.AssignmentFailed}
)

// writeTimeout bounds one write: during a fault writes fail or time out,
// and the writer moves on at its rate.
const writeTimeout = 5 * time.Second

// writer makes creates, updates, status updates and deletes through the
// API server at a steady rate. Its writes may fail during a fault; what
// counts is what etcd recorded, which the truth reads.
type writer struct {
	client versioned.Interface
	rng    *rand.Rand
	// acked is the newest resourceVersion a write was acknowledged at.
	acked atomic.Int64

	// mu guards the fields below.
	mu     sync.Mutex
	next   int
	live   []string // namespace/name of objects believed to exist
	ok     int
	failed map[string]int
	// messages counts the failures by operation, code and message.
	messages map[string]int
	// latencies are run's writes, acknowledged or failed.
	latencies []timedWrite
}

// timedWrite is when a write started, how long it took and whether it failed.
type timedWrite struct {
	at     time.Time
	took   time.Duration
	failed bool
}

// p99 returns the 99th percentile of the latencies of the writes run
// started in [from, to), and how many there were.
func (w *writer) p99(from, to time.Time) (time.Duration, int) {
	w.mu.Lock()
	var in []time.Duration
	for _, l := range w.latencies {
		if !l.failed && !l.at.Before(from) && l.at.Before(to) {
			in = append(in, l.took)
		}
	}
	w.mu.Unlock()
	if len(in) == 0 {
		return 0, 0
	}
	slices.Sort(in)
	return in[min(len(in)-1, len(in)*99/100)], len(in)
}

// failedBetween returns how many of run's writes started in [from, to)
// failed, and how many started then.
func (w *writer) failedBetween(from, to time.Time) (failed, started int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.latencies {
		if !l.at.Before(from) && l.at.Before(to) {
			started++
			if l.failed {
				failed++
			}
		}
	}
	return failed, started
}

func newWriter(client versioned.Interface, seed uint64) *writer {
	return &writer{client: client, rng: rand.New(rand.NewPCG(seed, seed)), failed: map[string]int{},
		messages: map[string]int{}}
}

// populate creates n objects before the clients start.
func (w *writer) populate(ctx context.Context, n int) error {
	for i := 0; i < n; i++ {
		if err := w.create(ctx); err != nil {
			return err
		}
	}
	return nil
}

// run writes at rate per second until ctx ends.
func (w *writer) run(ctx context.Context, rate float64) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		err := w.step(ctx)
		if err != nil && ctx.Err() != nil {
			return
		}
		if err != nil {
			w.fail(err)
		}
		w.mu.Lock()
		w.latencies = append(w.latencies, timedWrite{at: start, took: time.Since(start), failed: err != nil})
		w.mu.Unlock()
	}
}

// step makes one write, chosen so that about 40–80 objects stay alive.
func (w *writer) step(ctx context.Context) error {
	w.mu.Lock()
	n := len(w.live)
	w.mu.Unlock()
	r := w.rng.IntN(100)
	switch {
	case n < 40 || r < 30:
		return w.create(ctx)
	case n > 80 || r < 45:
		return w.delete(ctx)
	case r < 70:
		return w.update(ctx)
	default:
		return w.updateStatus(ctx)
	}
}

func (w *writer) create(ctx context.Context) error {
	w.mu.Lock()
	w.next++
	a := &v1beta1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("obj-%05d", w.next), Namespace: namespaces[w.rng.IntN(len(namespaces))],
			Labels: map[string]string{"tier": tiers[w.rng.IntN(len(tiers))]}},
		Spec: v1beta1.AssignmentSpec{AgentName: agents[w.rng.IntN(len(agents))], Payload: "p"},
	}
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	out, err := w.client.FleetV1beta1().Assignments(a.Namespace).Create(ctx, a, metav1.CreateOptions{})
	if err == nil || apierrors.IsAlreadyExists(err) {
		w.mu.Lock()
		w.live = append(w.live, a.Namespace+"/"+a.Name)
		w.mu.Unlock()
	}
	return w.record("create", out, err)
}

// pick returns a random live object, removing it from the live set when remove.
func (w *writer) pick(remove bool) (namespace, name string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.live) == 0 {
		return "", "", false
	}
	i := w.rng.IntN(len(w.live))
	key := w.live[i]
	if remove {
		w.live[i] = w.live[len(w.live)-1]
		w.live = w.live[:len(w.live)-1]
	}
	for j := range key {
		if key[j] == '/' {
			return key[:j], key[j+1:], true
		}
	}
	return "", "", false
}

func (w *writer) forget(namespace, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, k := range w.live {
		if k == namespace+"/"+name {
			w.live[i] = w.live[len(w.live)-1]
			w.live = w.live[:len(w.live)-1]
			return
		}
	}
}

func (w *writer) delete(ctx context.Context) error {
	ns, name, ok := w.pick(true)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	err := w.client.FleetV1beta1().Assignments(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		// It may still exist; keep it a candidate.
		w.mu.Lock()
		w.live = append(w.live, ns+"/"+name)
		w.mu.Unlock()
	}
	return w.record("delete", nil, err)
}

// update changes the spec and moves the object between label selectors.
func (w *writer) update(ctx context.Context) error {
	w.mu.Lock()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"tier":%q}},"spec":{"priority":%d}}`,
		tiers[w.rng.IntN(len(tiers))], w.rng.IntN(100))
	w.mu.Unlock()
	return w.patch(ctx, "update", patch)
}

// updateStatus moves the object between status.phase field selectors.
func (w *writer) updateStatus(ctx context.Context) error {
	w.mu.Lock()
	patch := fmt.Sprintf(`{"status":{"phase":%q}}`, phases[w.rng.IntN(len(phases))])
	w.mu.Unlock()
	return w.patch(ctx, "status", patch, "status")
}

// patch merge-patches a random live object, or its subresource.
func (w *writer) patch(ctx context.Context, op, patch string, subresource ...string) error {
	ns, name, ok := w.pick(false)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	out, err := w.client.FleetV1beta1().Assignments(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, subresource...)
	if apierrors.IsNotFound(err) {
		w.forget(ns, name)
	}
	return w.record(op, out, err)
}

// opError is a failed write, named by its operation and code.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return e.op + ": " + e.err.Error() }

// fail counts a failed write, by operation and HTTP code.
func (w *writer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	op, cause := "write", err
	if oe, ok := err.(*opError); ok {
		op, cause = oe.op, oe.err
	}
	code := "other"
	if s, ok := cause.(apierrors.APIStatus); ok {
		code = strconv.Itoa(int(s.Status().Code))
	}
	w.failed[op+" "+code]++
	w.messages[op+" "+code+": "+cause.Error()]++
}

// failedWith returns how many writes failed with a message holding s, and
// one of those failures, as operation, code and message.
func (w *writer) failedWith(s string) (n int, example string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for m, k := range w.messages {
		if strings.Contains(m, s) {
			n, example = n+k, m
		}
	}
	return n, example
}

func (w *writer) record(op string, out *v1beta1.Assignment, err error) error {
	if err != nil {
		return &opError{op: op, err: err}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ok++
	if out != nil {
		w.ack(parseRV(out.ResourceVersion))
	}
	return nil
}

// ack records a write acknowledged at revision rv, by this writer or by
// another that shares its count.
func (w *writer) ack(rv int64) {
	for {
		cur := w.acked.Load()
		if rv <= cur || w.acked.CompareAndSwap(cur, rv) {
			return
		}
	}
}

// succeeded returns how many writes were acknowledged.
func (w *writer) succeeded() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ok
}

// sentinel is a write made after a fault healed, that every open stream
// whose selector it matches must receive.
type sentinel struct {
	key   string
	acked time.Time
	rv    int64
}

// writeSentinel creates an object in sel, retrying until a write goes
// through or ctx ends: right after a fault heals the server may still be
// reconnecting.
func (w *writer) writeSentinel(ctx context.Context, sel selector, n int) (sentinel, error) {
	if sel.resource == agentsRes {
		return w.writeAgentSentinel(ctx, sel, n)
	}
	ns := sel.namespace
	if ns == "" {
		ns = namespaces[0]
	}
	m, err := newMatcher(sel)
	if err != nil {
		return sentinel{}, err
	}
	a := &v1beta1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sentinel-%03d", n), Namespace: ns, Labels: map[string]string{"tier": "gold"}},
		Spec:       v1beta1.AssignmentSpec{AgentName: agents[0]},
	}
	// Fit the object to the selector's requirements.
	if reqs, ok := m.label.Requirements(); ok {
		for _, req := range reqs {
			if v := req.Values().List(); len(v) > 0 {
				a.Labels[req.Key()] = v[0]
			}
		}
	}
	for _, req := range m.field.Requirements() {
		if req.Field == "spec.agentName" {
			a.Spec.AgentName = req.Value
		}
	}
	phase := ""
	for _, req := range m.field.Requirements() {
		if req.Field == "status.phase" && req.Value != string(v1beta1.AssignmentPending) {
			phase = req.Value
		}
	}
	client := w.client.FleetV1beta1().Assignments(ns)
	var out *v1beta1.Assignment
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		wctx, cancel := context.WithTimeout(ctx, writeTimeout)
		defer cancel()
		var err error
		if out == nil {
			if out, err = client.Create(wctx, a, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				out, err = client.Get(wctx, a.Name, metav1.GetOptions{})
			}
			if err != nil {
				out = nil
				return false, nil
			}
		}
		if phase != "" && string(out.Status.Phase) != phase {
			patch := fmt.Sprintf(`{"status":{"phase":%q}}`, phase)
			got, err := client.Patch(wctx, a.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
			if err != nil {
				return false, nil
			}
			out = got
		}
		return true, nil
	})
	if err != nil {
		return sentinel{}, fmt.Errorf("no write went through for sentinel %s: %w", a.Name, err)
	}
	if !m.matches(&objState{namespace: out.Namespace, name: out.Name, labels: out.Labels, agent: out.Spec.AgentName, phase: string(out.Status.Phase)}) {
		return sentinel{}, fmt.Errorf("sentinel %s does not match %s", a.Name, sel)
	}
	return sentinel{key: ns + "/" + a.Name, acked: time.Now(), rv: parseRV(out.ResourceVersion)}, nil
}

// writeAgentSentinel is writeSentinel for a selector of agents.
func (w *writer) writeAgentSentinel(ctx context.Context, sel selector, n int) (sentinel, error) {
	m, err := newMatcher(sel)
	if err != nil {
		return sentinel{}, err
	}
	a := &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sentinel-%03d", n)}, Spec: v1beta1.AgentSpec{Zone: "zone-a"}}
	for _, req := range m.field.Requirements() {
		if req.Field == "spec.zone" {
			a.Spec.Zone = req.Value
		}
	}
	client := w.client.FleetV1beta1().Agents()
	var out *v1beta1.Agent
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		wctx, cancel := context.WithTimeout(ctx, writeTimeout)
		defer cancel()
		var err error
		if out, err = client.Create(wctx, a, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			out, err = client.Get(wctx, a.Name, metav1.GetOptions{})
		}
		return err == nil, nil
	})
	if err != nil {
		return sentinel{}, fmt.Errorf("no write went through for sentinel agent %s: %w", a.Name, err)
	}
	if !m.matches(&objState{name: out.Name, labels: out.Labels, zone: out.Spec.Zone}) {
		return sentinel{}, fmt.Errorf("sentinel agent %s does not match %s", a.Name, sel)
	}
	return sentinel{key: a.Name, acked: time.Now(), rv: parseRV(out.ResourceVersion)}, nil
}
