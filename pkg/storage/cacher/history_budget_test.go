package cacher

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// TestHistoryBudget writes 40 pods of 4 KiB through a cache whose history
// may hold 64 KiB: the oldest events leave inside the window, a watch from
// before them gets 410 Gone, and one from a recent resourceVersion gets
// every event after it.
func TestHistoryBudget(t *testing.T) {
	const budget = 64 << 10
	c := newTestCacher(t, func(o *setupOptions) {
		o.config = func(cfg *Config) { cfg.HistoryBudget = budget }
	})
	ctx := context.Background()
	var rvs []string
	for i := range 40 {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i), Namespace: "ns",
			Annotations: map[string]string{"payload": strings.Repeat("x", 4096)}}}
		out := &example.Pod{}
		if err := (createWrapper{c}).Create(ctx, "/pods/ns/"+pod.Name, pod, out, 0); err != nil {
			t.Fatal(err)
		}
		rvs = append(rvs, out.ResourceVersion)
	}
	if bytes, evicted := c.log.Usage(); bytes > budget || evicted == 0 {
		t.Fatalf("history holds %d bytes (budget %d), %d evicted; want within the budget and some evicted", bytes, budget, evicted)
	}

	old, err := c.Watch(ctx, "/pods/ns", storage.ListOptions{ResourceVersion: rvs[0], Predicate: storage.Everything, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Stop()
	if ev, _ := testkit.Recv(t, old.ResultChan(), "the 410"); ev.Type != watch.Error || !apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) {
		t.Fatalf("watch from an evicted resourceVersion: got %s %v, want 410 Expired", ev.Type, ev.Object)
	}

	recent, err := c.Watch(ctx, "/pods/ns", storage.ListOptions{ResourceVersion: rvs[35], Predicate: storage.Everything, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer recent.Stop()
	for i := 36; i < 40; i++ {
		ev, _ := testkit.Recv(t, recent.ResultChan(), "an event from a recent resourceVersion")
		if ev.Type != watch.Added {
			t.Fatalf("watch from a recent resourceVersion: got %s %v", ev.Type, ev.Object)
		}
		if name := objecttest.MetaOf(t, ev.Object).GetName(); name != fmt.Sprintf("p-%d", i) {
			t.Fatalf("got %s, want p-%d", name, i)
		}
	}
}
