package cacher

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// TestWatchInitializedAfterInitialEvents checks what priority and fairness
// learns from the cache: a watch-list is executing until its initial
// events are sent, as upstream's cache reports, so that its seats bound
// how many stream at once; a watch with no initial events is initialized
// when it is set up.
func TestWatchInitializedAfterInitialEvents(t *testing.T) {
	c := newTestCacher(t, func(o *setupOptions) { o.config = func(cfg *Config) { cfg.WatcherBuffer = 1 } })
	ctx := context.Background()
	var rv string
	for i := range 3 {
		out := &example.Pod{}
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "ns"}}
		if err := c.Create(ctx, "/pods/ns/"+pod.Name, pod, out, 0); err != nil {
			t.Fatal(err)
		}
		rv = out.ResourceVersion
	}
	signal := newSignal()
	pred := storage.Everything
	pred.AllowWatchBookmarks = true
	w, err := c.Watch(utilflowcontrol.WithInitializationSignal(ctx, signal), "/pods/", storage.ListOptions{
		Recursive: true, Predicate: pred, SendInitialEvents: ptr.To(true)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// The channel has room for the three objects, sized for the initial
	// events: once it is full, the bookmark that ends them is being sent.
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return w.(*fanout.Watcher).Pending() == 3, nil }); err != nil {
		t.Fatal("the watch-list never filled its buffer")
	}
	if signal.signaled() {
		t.Fatal("the watch-list was initialized before its initial events were sent")
	}
	if got := objecttest.Receive(t, w, 4); got[3].Type != watch.Bookmark {
		t.Fatalf("initial events: %v", got)
	}
	testkit.Recv(t, signal.done, "the watch-list never reported its initial events sent")

	signal = newSignal()
	resumed, err := c.Watch(utilflowcontrol.WithInitializationSignal(ctx, signal), "/pods/", storage.ListOptions{
		Recursive: true, Predicate: storage.Everything, ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Stop()
	if !signal.signaled() {
		t.Fatal("a watch from a resourceVersion was not initialized when set up")
	}
}

// signal is an InitializationSignal that can be looked at.
type signal struct {
	once sync.Once
	done chan struct{}
}

func newSignal() *signal { return &signal{done: make(chan struct{})} }

func (s *signal) Signal() { s.once.Do(func() { close(s.done) }) }
func (s *signal) Wait()   { <-s.done }

func (s *signal) signaled() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}
