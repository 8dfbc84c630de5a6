package cacher

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	upstreamcacher "k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/cache"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

// diffWatch is one watch the difference test opens on both caches.
type diffWatch struct {
	name      string
	key       string
	recursive bool
	pred      storage.SelectionPredicate
}

// diffEvent is what the test compares of an event: enough to tell a
// missed, extra, reordered or mistyped event, or the wrong state of a
// leaving object.
type diffEvent struct {
	typ       watch.EventType
	key, rv   string
	app, node string
	uid       types.UID
}

func (e diffEvent) String() string {
	return fmt.Sprintf("%s %s@%s app=%s node=%s", e.typ, e.key, e.rv, e.app, e.node)
}

// TestIndexedDispatchMatchesUpstream runs one random trace of creates,
// updates and deletes through our cache and upstream's, side by side over
// the same etcd, with the same watchers open on both: single objects,
// namespaces, the trigger field, names across namespaces, UID and
// namespace shards (one range and several ORed), label selectors, and
// labels and fields that change together. Every watcher must get the same
// events from both, in the same order: what upstream's per-watcher
// filtering delivers, our index must find. An oracle computed from the
// trace with upstream's own SelectionPredicate.Matches tells how many
// events each watcher waits for.
func TestIndexedDispatchMatchesUpstream(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ShardedListAndWatch, true)
	ctx := context.Background()
	server := newTestEtcd(t)
	newRaw := func() storage.Interface {
		compactor := etcd3.NewCompactor(server.V3Client.Client, 0, clock.RealClock{}, nil)
		t.Cleanup(compactor.Stop)
		raw, err := etcd3.New(server.V3Client, compactor, examplev1Blob, newBenchPod, newBenchPodList, etcd3testing.PathPrefix(),
			"/pods/", schema.GroupResource{Resource: "pods"}, identity.NewEncryptCheckTransformer(),
			etcd3.NewDefaultLeaseManagerConfig(), etcd3.NewDefaultDecoder(examplev1Blob, storage.APIObjectVersioner{}), storage.APIObjectVersioner{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(raw.Close)
		return raw
	}
	writer := newRaw()
	triggers := storage.IndexerFuncs{"spec.nodeName": func(obj runtime.Object) string { return obj.(*example.Pod).Spec.NodeName }}
	keyFunc := func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc("/pods/", obj) }
	ours, err := New(Config{Storage: newRaw(), GroupResource: schema.GroupResource{Resource: "pods"}, ResourcePrefix: "/pods/",
		KeyFunc: keyFunc, NewFunc: newBenchPod, NewListFunc: newBenchPodList, GetAttrsFunc: podAttrs, IndexerFuncs: triggers, Codec: examplev1Blob,
		Client: server.V3Client.Client, StoragePrefix: etcd3testing.PathPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ours.Stop)
	waitReady(t, ours)
	theirsCacher, err := upstreamcacher.NewCacherFromConfig(upstreamcacher.Config{
		Storage: newRaw(), Versioner: storage.APIObjectVersioner{}, GroupResource: schema.GroupResource{Resource: "pods"},
		EventsHistoryWindow: upstreamcacher.DefaultEventFreshDuration, ResourcePrefix: "/pods/", KeyFunc: keyFunc,
		GetAttrsFunc: podAttrs, IndexerFuncs: triggers, Indexers: &cache.Indexers{}, NewFunc: newBenchPod,
		NewListFunc: newBenchPodList, Codec: examplev1Blob, Clock: clock.RealClock{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := theirsCacher.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	theirs := upstreamcacher.NewCacheDelegator(theirsCacher, writer)
	t.Cleanup(func() { theirs.Stop(); theirsCacher.Stop() })

	watches := diffWatches()
	rv0, err := writer.GetCurrentResourceVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*[2]diffStream{}
	for _, dw := range watches {
		streams := &[2]diffStream{}
		got[dw.name] = streams
		for i, s := range []storage.Interface{ours, theirs} {
			w, err := s.Watch(ctx, dw.key, storage.ListOptions{ResourceVersion: strconv.FormatUint(rv0, 10),
				Recursive: dw.recursive, Predicate: dw.pred})
			if err != nil {
				t.Fatalf("%s: %v", dw.name, err)
			}
			streams[i].start(w)
		}
	}

	// A fixed seed, so that every run exercises every watch; the trace
	// varies enough within it. The check at the end says if it does not.
	const seed = 26
	// In lockstep: after each write, every watcher the oracle says it
	// reaches has it, from both caches, before the next. Written at full
	// speed, the trace made upstream's cache close watchers that fell
	// behind its 100 ms budget.
	var ops []diffOp
	trace := newTrace(rand.New(rand.NewPCG(seed, seed)))
	for i := range 400 {
		op := trace.write(ctx, t, writer, i)
		ops = append(ops, op)
		for _, dw := range watches {
			want := oracle(dw, ops)
			if len(want) == len(oracle(dw, ops[:len(ops)-1])) {
				continue
			}
			for i, impl := range []string{"ours", "upstream"} {
				if err := got[dw.name][i].waitFor(len(want)); err != nil {
					t.Fatalf("%s, %s, after %s at %d: %v\n got  %v\n want %v", dw.name, impl, op.typ, op.rv, err,
						got[dw.name][i].events(), want)
				}
			}
		}
	}
	for _, dw := range watches {
		want := oracle(dw, ops)
		streams := got[dw.name]
		for i := range streams {
			streams[i].stop()
		}
		o, u := streams[0].events(), streams[1].events()
		if !slices.Equal(u, want) {
			t.Errorf("%s: upstream differs from the oracle, which the test needs to be right:\n upstream %v\n oracle   %v", dw.name, u, want)
		}
		if !slices.Equal(o, u) {
			t.Errorf("%s: %d events from ours, %d from upstream:\n ours     %v\n upstream %v", dw.name, len(o), len(u), o, u)
		}
	}
	// Lists and watch-lists of the final state, with the same selectors.
	for _, dw := range watches {
		var lists [2]string
		var initial [2][]string
		for i, s := range []storage.Interface{ours, theirs} {
			list := &example.PodList{}
			if err := s.GetList(ctx, dw.key, storage.ListOptions{Recursive: dw.recursive, Predicate: dw.pred}, list); err != nil {
				t.Fatalf("%s: list: %v", dw.name, err)
			}
			lists[i] = fmt.Sprintf("%v shardInfo=%+v", podKeys(list.Items), list.ShardInfo)
			initial[i] = watchListKeys(ctx, t, s, dw)
		}
		if lists[0] != lists[1] {
			t.Errorf("%s: list\n ours     %s\n upstream %s", dw.name, lists[0], lists[1])
		}
		if !slices.Equal(initial[0], initial[1]) {
			t.Errorf("%s: watch-list's initial events\n ours     %v\n upstream %v", dw.name, initial[0], initial[1])
		}
	}
	for _, dw := range watches {
		if len(oracle(dw, ops)) == 0 {
			t.Errorf("%s got no event: the trace does not exercise it", dw.name)
		}
	}
}

func podKeys(pods []example.Pod) []string {
	keys := make([]string, 0, len(pods))
	for _, p := range pods {
		keys = append(keys, p.Namespace+"/"+p.Name)
	}
	return keys
}

// watchListKeys returns the keys of a watch-list's initial events, up to
// its initial-events-end bookmark.
func watchListKeys(ctx context.Context, t *testing.T, s storage.Interface, dw diffWatch) []string {
	t.Helper()
	pred := dw.pred
	pred.AllowWatchBookmarks = true
	w, err := s.Watch(ctx, dw.key, storage.ListOptions{Recursive: dw.recursive, Predicate: pred, SendInitialEvents: ptr.To(true)})
	if err != nil {
		t.Fatalf("%s: watch-list: %v", dw.name, err)
	}
	defer w.Stop()
	keys := []string{}
	timeout := time.After(wait.ForeverTestTimeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("%s: watch-list ended before its bookmark, after %v", dw.name, keys)
			}
			if ev.Type == watch.Bookmark {
				return keys
			}
			m, _ := meta.Accessor(ev.Object)
			keys = append(keys, fmt.Sprintf("%s %s/%s", ev.Type, m.GetNamespace(), m.GetName()))
		case <-timeout:
			t.Fatalf("%s: watch-list had no bookmark after %v", dw.name, keys)
		}
	}
}

// diffWatches are the watches of the difference test, as the generic
// registry opens them.
func diffWatches() []diffWatch {
	field := func(sel string) fields.Selector { return fields.ParseSelectorOrDie(sel) }
	label := func(sel string) labels.Selector {
		s, err := labels.Parse(sel)
		if err != nil {
			panic(err)
		}
		return s
	}
	pred := func(l labels.Selector, f fields.Selector, shards ...[2]string) storage.SelectionPredicate {
		p := storage.SelectionPredicate{Label: l, Field: f, GetAttrs: podAttrs}
		if len(shards) > 0 {
			path := shard.UIDPath
			if shards[0][0] == "ns" {
				path, shards = shard.NamespacePath, shards[1:]
			}
			p.ShardSelector = objecttest.ShardSelector(path, shards...)
		}
		return p
	}
	everything, none := labels.Everything(), fields.Everything()
	quarter := func(i int) [2]string {
		end := fmt.Sprintf("0x%016x", uint64(i+1)<<62)
		if i == 3 {
			end = "0x10000000000000000"
		}
		return [2]string{fmt.Sprintf("0x%016x", uint64(i)<<62), end}
	}
	return []diffWatch{
		{"everything", "/pods/", true, pred(everything, none)},
		{"one object", "/pods/echo/p1", false, pred(everything, field("metadata.name=p1"))},
		{"one object, label", "/pods/staging/p2", false, pred(label("app=web"), field("metadata.name=p2"))},
		{"namespace", "/pods/staging/", true, pred(everything, none)},
		{"namespace, label", "/pods/prod/", true, pred(label("app=web"), none)},
		{"trigger n1", "/pods/", true, pred(everything, field("spec.nodeName=n1"))},
		{"trigger n2 in a namespace", "/pods/echo/", true, pred(everything, field("spec.nodeName=n2"))},
		{"trigger and label change together", "/pods/", true, pred(label("app=web"), field("spec.nodeName=n1"))},
		{"trigger negated", "/pods/", true, pred(everything, field("spec.nodeName!=n1"))},
		{"name across namespaces", "/pods/", true, pred(everything, field("metadata.name=p3"))},
		{"label", "/pods/", true, pred(label("app=web"), none)},
		{"label in one value", "/pods/", true, pred(label("app in (db)"), none)},
		{"label in two values", "/pods/", true, pred(label("app in (db,web)"), none)},
		{"label and another", "/pods/", true, pred(label("app=db,app!=web"), none)},
		{"label not equal", "/pods/", true, pred(label("app!=web"), none)},
		{"label with uid shard", "/pods/", true, pred(label("app=web"), none, quarter(2))},
		{"uid quarter 0", "/pods/", true, pred(everything, none, quarter(0))},
		{"uid quarter 3", "/pods/", true, pred(everything, none, quarter(3))},
		{"uid quarters ORed", "/pods/", true, pred(everything, none, quarter(0), quarter(2))},
		{"uid quarters overlapping", "/pods/", true, pred(everything, none,
			[2]string{"0x0000000000000000", "0x8000000000000000"}, quarter(1))},
		{"uid half with label", "/pods/", true, pred(label("app=web"), none, [2]string{"0x8000000000000000", "0x10000000000000000"})},
		{"uid half with trigger", "/pods/", true, pred(everything, field("spec.nodeName=n2"), [2]string{"0x0000000000000000", "0x8000000000000000"})},
		{"uid quarter in a namespace", "/pods/echo/", true, pred(everything, none, quarter(1))},
		{"namespace shard", "/pods/", true, pred(everything, none, [2]string{"ns"}, [2]string{"0x0000000000000000", "0x8000000000000000"})},
		{"namespace shards ORed", "/pods/", true, pred(everything, none, [2]string{"ns"}, quarter(1), quarter(3))},
	}
}

// diffOp is one write of the trace: the state before and after, at rv.
type diffOp struct {
	typ       watch.EventType
	key       string
	rv        uint64
	prev, cur *example.Pod
}

// diffTrace makes random writes over 24 pods in three namespaces:
// creates with a random app label, node and UID; updates that change the
// label, the node, or both; deletes; and creates again, with a new UID.
type diffTrace struct {
	rng     *rand.Rand
	current map[string]*example.Pod
}

func newTrace(rng *rand.Rand) *diffTrace {
	return &diffTrace{rng: rng, current: map[string]*example.Pod{}}
}

// Labels, nodes and namespaces of the trace. The namespaces' hashes fall
// in the first, second and third quarters, which the namespace shard
// watches tell apart.
var (
	traceApps       = []string{"web", "db", ""}
	traceNodes      = []string{"n1", "n2", "n3"}
	traceNamespaces = []string{"echo", "staging", "prod"}
)

// write makes the trace's i-th write.
func (tr *diffTrace) write(ctx context.Context, t *testing.T, s storage.Interface, i int) diffOp {
	t.Helper()
	rng := tr.rng
	ns, name := traceNamespaces[rng.IntN(3)], fmt.Sprintf("p%d", rng.IntN(8)+1)
	key := "/pods/" + ns + "/" + name
	prev := tr.current[key]
	op := diffOp{key: key, prev: prev}
	switch {
	case prev == nil:
		// Random, as real UIDs are: FNV-1a's high bits barely move
		// between strings that differ only at the end.
		uid := types.UID(fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", rng.Uint32(), rng.Uint32N(1<<16), rng.Uint32N(1<<16),
			rng.Uint32N(1<<16), rng.Uint64N(1<<48)))
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uid,
			Labels: map[string]string{"app": traceApps[rng.IntN(3)]}}, Spec: example.PodSpec{NodeName: traceNodes[rng.IntN(3)]}}
		out := &example.Pod{}
		if err := s.Create(ctx, key, pod, out, 0); err != nil {
			t.Fatal(err)
		}
		op.typ, op.cur = watch.Added, out
	case rng.IntN(4) == 0:
		out := &example.Pod{}
		if err := s.Delete(ctx, key, out, nil, storage.ValidateAllObjectFunc, nil, storage.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		op.typ = watch.Deleted
	default:
		out := &example.Pod{}
		change := rng.IntN(3)
		err := s.GuaranteedUpdate(ctx, key, out, false, nil, func(in runtime.Object, _ storage.ResponseMeta) (runtime.Object, *uint64, error) {
			pod := in.(*example.Pod).DeepCopy()
			if change != 1 {
				pod.Labels = map[string]string{"app": traceApps[rng.IntN(3)]}
			}
			if change != 0 {
				pod.Spec.NodeName = traceNodes[rng.IntN(3)]
			}
			pod.Annotations = map[string]string{"write": strconv.Itoa(i)}
			return pod, nil, nil
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		op.typ, op.cur = watch.Modified, out
	}
	// One writer: the revision after the write is the write's.
	rv, err := s.GetCurrentResourceVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	op.rv = rv
	tr.current[key] = op.cur
	return op
}

// oracle is what a watch receives of the trace, by the Kubernetes rules:
// entering is ADDED, staying MODIFIED, leaving or deleted DELETED with the
// previous state at the event's resourceVersion.
func oracle(dw diffWatch, ops []diffOp) []diffEvent {
	var out []diffEvent
	matches := func(p *example.Pod) bool {
		if p == nil {
			return false
		}
		ok, err := dw.pred.Matches(p)
		return err == nil && ok
	}
	for _, op := range ops {
		if !fanout.InScope(dw.key, dw.recursive, op.key) {
			continue
		}
		prevOK, curOK := matches(op.prev), op.typ != watch.Deleted && matches(op.cur)
		var typ watch.EventType
		state := op.cur
		switch {
		case curOK && prevOK:
			typ = watch.Modified
		case curOK:
			typ = watch.Added
		case prevOK:
			typ, state = watch.Deleted, op.prev
		default:
			continue
		}
		out = append(out, diffEvent{typ: typ, key: op.key, rv: strconv.FormatUint(op.rv, 10), app: state.Labels["app"],
			node: state.Spec.NodeName, uid: state.UID})
	}
	return out
}

// diffStream collects one watch's events, bookmarks aside.
type diffStream struct {
	w    watch.Interface
	done chan struct{}
	// mu guards got.
	mu  sync.Mutex
	got []diffEvent
}

func (s *diffStream) start(w watch.Interface) {
	s.w, s.done = w, make(chan struct{})
	go func() {
		defer close(s.done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Bookmark {
				continue
			}
			e := diffEvent{typ: ev.Type}
			obj := ev.Object
			if co, ok := obj.(runtime.CacheableObject); ok {
				// Both caches share an event's encodings through a wrapper.
				obj = co.GetObject()
			}
			if pod, ok := obj.(*example.Pod); ok {
				e.key, e.rv, e.app, e.node, e.uid = "/pods/"+pod.Namespace+"/"+pod.Name, pod.ResourceVersion, pod.Labels["app"], pod.Spec.NodeName, pod.UID
			} else {
				e.key = fmt.Sprintf("%T", obj)
			}
			s.mu.Lock()
			s.got = append(s.got, e)
			s.mu.Unlock()
		}
	}()
}

// waitFor waits until the stream holds n events.
func (s *diffStream) waitFor(n int) error {
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.got) >= n, nil
	})
	if err != nil {
		return fmt.Errorf("%d events of %d after 10s", len(s.events()), n)
	}
	return nil
}

// stop ends the watch and waits until every event it delivered is read.
func (s *diffStream) stop() {
	s.w.Stop()
	select {
	case <-s.done:
	case <-time.After(wait.ForeverTestTimeout):
	}
}

func (s *diffStream) events() []diffEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}
