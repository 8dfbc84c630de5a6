package cacher

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/component-base/metrics/testutil"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// TestDecodeErrorEndsWatchers replaces upstream's RunTestWatchError, whose
// premise (a transformer swapped after the write) cannot hold for a cache
// that decoded the object at ingest. It checks the same promise: when the
// cache cannot decode what etcd sends, watchers get an error and end, the
// cache answers 429 until a re-list succeeds, and nothing is silently skipped.
func TestDecodeErrorEndsWatchers(t *testing.T) {
	etcd3.TestOnlySetFatalOnDecodeError(t, false)
	codec := &failingCodec{Codec: examplev1Blob}
	c := newTestCacher(t, withCodec(codec))
	ctx := context.Background()

	first := &example.Pod{}
	if err := c.Create(ctx, "/pods/ns/a", &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}, first, 0); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: first.ResourceVersion, Recursive: true, Predicate: storage.Everything})
	if err != nil {
		t.Fatal(err)
	}
	codec.failing.Store(true)
	// The write lands; only decoding its answer fails.
	_ = c.Create(ctx, "/pods/ns/b", &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns"}}, &example.Pod{}, 0)

	var events []watch.Event
	timeout := time.After(wait.ForeverTestTimeout)
	for done := false; !done; {
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				done = true
				continue
			}
			events = append(events, e)
		case <-timeout:
			t.Fatal("the watch did not end after a decode failure")
		}
	}
	if len(events) != 1 || events[0].Type != watch.Error {
		t.Fatalf("got %v, want exactly one ERROR event and no silent gap", events)
	}
	if status := events[0].Object.(*metav1.Status); status.Code != 410 {
		t.Fatalf("error event %#v, want 410", status)
	}

	// While the cache cannot list, it answers 429.
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, wait.ForeverTestTimeout, true, func(context.Context) (bool, error) {
		return c.ReadinessCheck() != nil, nil
	}); err != nil {
		t.Fatal("cache stayed ready without its etcd watch")
	}
	if _, err := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("watch while re-listing: got %v, want 429", err)
	}

	// Once decoding works again the cache re-lists and holds both objects.
	codec.failing.Store(false)
	waitReady(t, c.Cacher)
	list := &example.PodList{}
	if err := c.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("after re-listing the cache holds %d objects, want 2", len(list.Items))
	}
}

// replayingChanges repeats, on the cache's etcd watches, the changes it is
// told to, as etcd's client does when it resumes a watch on a member that
// is behind (etcd-io/etcd#20221). A warm start's backfill watches the same
// way, and would take a replay and drop it: a test waits for its cache to
// be ready before it writes, so that the cache lists an empty etcd and
// has nothing to backfill.
type replayingChanges struct {
	source.Changes
	// replay takes the changes to repeat, as one response, after the
	// response being passed.
	replay chan []source.Change
}

func (c *replayingChanges) Watch(ctx context.Context, rev uint64) source.ChangeStream {
	inner := c.Changes.Watch(ctx, rev)
	out := make(chan source.Response)
	go func() {
		defer close(out)
		for {
			// An ended watch takes no replay: with both ready, the select
			// below would pick one at random.
			if ctx.Err() != nil {
				return
			}
			var r source.Response
			select {
			case resp, ok := <-inner.Responses():
				if !ok {
					return
				}
				r = resp
			case r.Changes = <-c.replay:
			case <-ctx.Done():
				return
			}
			select {
			case out <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return &replayingStream{ChangeStream: inner, out: out}
}

// replayingStream is one watch of replayingChanges.
type replayingStream struct {
	source.ChangeStream
	out chan source.Response
}

func (s *replayingStream) Responses() <-chan source.Response { return s.out }

// TestReplayedEventsDropped checks that revisions etcd delivers again, at
// or before the newest the cache applied, change nothing: no watcher
// receives them, lists and gets still read the newest versions, and the
// replayed-events counter counts them. Applied, the update's repeat would
// put the pod's first version back under a newer resourceVersion, the
// stale list the silent-member scenario once found.
func TestReplayedEventsDropped(t *testing.T) {
	rs := &replayingChanges{replay: make(chan []source.Change)}
	c := newTestCacher(t, func(o *setupOptions) {
		o.changes = func(ch source.Changes) source.Changes { rs.Changes = ch; return rs }
	})
	// Ready before the writes: see replayingStore.
	waitReady(t, c.Cacher)
	ctx := context.Background()
	v1, v2 := &example.Pod{}, &example.Pod{}
	if err := c.Create(ctx, "/pods/ns/a", &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}, v1, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.GuaranteedUpdate(ctx, "/pods/ns/a", v2, false, nil, func(in runtime.Object, _ storage.ResponseMeta) (runtime.Object, *uint64, error) {
		pod := in.(*example.Pod).DeepCopy()
		pod.Spec.NodeName = "n2"
		return pod, nil, nil
	}, nil); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: v2.ResourceVersion, Recursive: true, Predicate: storage.Everything})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	replayed := func() float64 { v, _ := testutil.GetCounterMetricValue(c.metrics.source.Replayed); return v }
	before := replayed()

	// The creation, below the head, and the update, at it.
	change := func(p *example.Pod) source.Change {
		rv, _ := c.cfg.Versioner.ParseResourceVersion(p.ResourceVersion)
		return source.Change{Key: "/pods/ns/a", Rev: rv, Object: p.DeepCopy()}
	}
	select {
	case rs.replay <- []source.Change{change(v1), change(v2)}:
	case <-time.After(wait.ForeverTestTimeout):
		t.Fatal("the cache's etcd watch never took the replay")
	}
	// A new write after them: its event is the watcher's first, since the
	// cache ingests in order.
	if err := c.Create(ctx, "/pods/ns/b", &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns"}}, &example.Pod{}, 0); err != nil {
		t.Fatal(err)
	}
	if got := objecttest.Receive(t, w, 1); got[0].Name != "b" || got[0].Type != watch.Added {
		t.Fatalf("the watcher's first event after the replay: %v, want ADDED b", got)
	}
	// The history holds each event once: a watch from the creation reads
	// the update and b, and nothing twice.
	fromV1, err := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: v1.ResourceVersion, Recursive: true, Predicate: storage.Everything})
	if err != nil {
		t.Fatal(err)
	}
	defer fromV1.Stop()
	if got := objecttest.Receive(t, fromV1, 2); got[0].Name != "a" || got[0].RV != v2.ResourceVersion || got[1].Name != "b" {
		t.Fatalf("a watch from the creation reads %v, want a at %s, then b", got, v2.ResourceVersion)
	}
	if n := fromV1.(*fanout.Watcher).Pending(); n != 0 {
		t.Fatalf("a watch from the creation holds %d more events, want none", n)
	}
	if n := replayed() - before; n != 2 {
		t.Errorf("%v events counted as replayed, want 2", n)
	}
	list := &example.PodList{}
	if err := c.GetList(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: storage.Everything}, list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 || list.Items[0].ResourceVersion != v2.ResourceVersion || list.Items[0].Spec.NodeName != "n2" {
		t.Fatalf("after the replay the cache lists %d pods, a at %s on %q; want 2, a at %s on n2",
			len(list.Items), list.Items[0].ResourceVersion, list.Items[0].Spec.NodeName, v2.ResourceVersion)
	}
}
