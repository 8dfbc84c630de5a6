package fanout

import (
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// TestLeavingObjectShared checks that the watchers an event moves out of
// their selector, even when they reach it at once, all get one object: the
// previous state at the event's resourceVersion.
func TestLeavingObjectShared(t *testing.T) {
	prev := objecttest.PodObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns",
		Labels: map[string]string{"app": "web"}, ResourceVersion: "5"}})
	cur := objecttest.PodObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns",
		ResourceVersion: "7"}})
	e := &Event{Type: watch.Modified, Key: prev.Key, Rev: 7, Cur: cur, Prev: prev}
	pr := NewPresenter("", objecttest.Pods.Codec(), nil)
	const watchers = 8
	got := make([]*object.Caching, watchers)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = e.leavingObject(storage.APIObjectVersioner{}, pr)
		}()
	}
	wg.Wait()
	for i, co := range got {
		if co != got[0] {
			t.Fatalf("watcher %d got another leaving object than watcher 0", i)
		}
	}
	if o := got[0].Cached(); o.RV != 7 || o.Labels().Get("app") != "web" {
		t.Errorf("leaving object at %d with labels %v, want the previous state at 7", o.RV, o.Labels().Set())
	}
}
