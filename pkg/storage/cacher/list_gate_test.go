package cacher

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/gate"
)

// TestListGateInGetList checks that a large list from the cache waits for
// the one ahead of it to end before copying its items, that an indexed or
// selective small list does not, and that a list whose deadline passes
// while it waits gets 504 Timeout.
func TestListGateInGetList(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	lists := gate.NewLists(gate.ListsConfig{Concurrency: 1, MinItems: 3, Clock: clk})
	c := newTestCacher(t, withNodeNameIndex, func(o *setupOptions) { o.config = func(cfg *Config) { cfg.Lists = lists } })
	ctx := context.Background()
	for i := range 3 {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "ns"},
			Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i)}}
		if err := c.Create(ctx, "/pods/ns/"+pod.Name, pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	list := func(ctx context.Context, pred storage.SelectionPredicate) (*example.PodList, error) {
		out := &example.PodList{}
		err := c.GetList(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: pred}, out)
		return out, err
	}
	first, endFirst := context.WithCancel(ctx)
	if out, err := list(first, storage.Everything); err != nil || len(out.Items) != 3 {
		t.Fatalf("the first list: %d items, %v", len(out.Items), err)
	}

	second := make(chan error, 1)
	go func() {
		out, err := list(ctx, storage.Everything)
		if err == nil && len(out.Items) != 3 {
			err = fmt.Errorf("%d items, want 3", len(out.Items))
		}
		second <- err
	}()
	testkit.WaitGauge(t, c.metrics.listsWaiting, 1, "large lists waiting")

	pinned := storage.SelectionPredicate{Label: labels.Everything(), Field: fields.OneTermEqualSelector("spec.nodeName", "node-1"),
		GetAttrs: podAttrs, IndexFields: []string{"spec.nodeName"}}
	if out, err := list(ctx, pinned); err != nil || len(out.Items) != 1 {
		t.Fatalf("a list of one object, the gate full: %d items, %v", len(out.Items), err)
	}
	late, endLate := context.WithCancel(ctx)
	lateErr := make(chan error, 1)
	go func() {
		_, err := list(late, storage.Everything)
		lateErr <- err
	}()
	testkit.WaitGauge(t, c.metrics.listsWaiting, 2, "large lists waiting")
	endLate()
	if err, _ := testkit.Recv(t, lateErr, "the late list's answer"); !apierrors.IsTimeout(err) {
		t.Fatalf("a large list whose request ended while it waited: %v, want 504 Timeout", err)
	}
	testkit.WaitGauge(t, c.metrics.listsWaiting, 1, "large lists waiting")

	select {
	case err := <-second:
		t.Fatalf("the second large list ended (%v) before the first", err)
	default:
	}
	endFirst()
	if err, _ := testkit.Recv(t, second, "the second large list never got in after the first ended"); err != nil {
		t.Fatalf("the second large list: %v", err)
	}
}
