package cacher

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
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
