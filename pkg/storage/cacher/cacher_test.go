package cacher

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// heldList holds the cache's own initial list (the only list with its page
// size) until released, so that the cache stays not ready.
type heldList struct {
	storage.Interface
	release chan struct{}
}

func (h *heldList) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	if opts.Predicate.Limit == source.ListPageSize {
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.Interface.GetList(ctx, key, opts, listObj)
}

// TestNotReady checks what reads get while the cache is initializing: 429
// with Retry-After by default, etcd's answer with ConsistentReadFallback.
func TestNotReady(t *testing.T) {
	ctx := context.Background()
	everything := storage.ListOptions{Recursive: true, Predicate: storage.Everything}
	tests := []struct {
		name     string
		fallback bool
	}{{name: "429 by default"}, {name: "fallback to etcd", fallback: true}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			held := &heldList{release: make(chan struct{})}
			c := newTestCacher(t, func(o *setupOptions) {
				o.wrap = func(s storage.Interface) storage.Interface { held.Interface = s; return held }
				o.config = func(cfg *Config) { cfg.ConsistentReadFallback = tc.fallback }
			})
			if err := c.Create(ctx, "/pods/ns/a", &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}, &example.Pod{}, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.ReadinessCheck(); err == nil {
				t.Fatal("ReadinessCheck passed before the initial list")
			}
			list := &example.PodList{}
			listErr := c.GetList(ctx, "/pods/", everything, list)
			_, watchErr := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything})
			getErr := c.Get(ctx, "/pods/ns/a", storage.GetOptions{ResourceVersion: "0"}, &example.Pod{})
			for what, err := range map[string]error{"list": listErr, "watch": watchErr, "get": getErr} {
				if tc.fallback {
					if err != nil {
						t.Errorf("%s with fallback: %v", what, err)
					}
					continue
				}
				if !apierrors.IsTooManyRequests(err) {
					t.Errorf("%s while not ready: got %v, want 429", what, err)
					continue
				}
				if seconds, ok := apierrors.SuggestsClientDelay(err); !ok || seconds < 1 {
					t.Errorf("%s: 429 without Retry-After", what)
				}
			}
			if tc.fallback && len(list.Items) != 1 {
				t.Errorf("fallback list has %d items, want 1 from etcd", len(list.Items))
			}
			close(held.release)
			waitReady(t, c.Cacher)
			if err := c.GetList(ctx, "/pods/", everything, &example.PodList{}); err != nil {
				t.Fatalf("list once ready: %v", err)
			}
		})
	}
}

// TestInitialEventsByTrigger checks that a watch-list pinned to a trigger
// value reads the objects with that value through the index, not every
// object: its other field terms are evaluated on those objects only, and
// it gets exactly them, in key order, then the end bookmark.
func TestInitialEventsByTrigger(t *testing.T) {
	c := newTestCacher(t, withNodeNameIndex)
	ctx := context.Background()
	for i := range 20 {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%02d", i), Namespace: "ns"},
			Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i%4)}}
		if err := c.Create(ctx, "/pods/ns/"+pod.Name, pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	parsed, err := fields.ParseSelector("spec.nodeName=node-1,spec.restartPolicy!=Never")
	if err != nil {
		t.Fatal(err)
	}
	sel := &countingSelector{Selector: parsed}
	pred := storage.SelectionPredicate{Label: labels.Everything(), Field: sel, GetAttrs: podAttrs, AllowWatchBookmarks: true}
	// A consistent list first: every pod is ingested.
	if err := c.GetList(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: storage.Everything}, &example.PodList{}); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: pred, SendInitialEvents: ptr.To(true)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	got := objecttest.Receive(t, w, 6)
	var names []string
	for _, e := range got[:5] {
		if e.Type != watch.Added {
			t.Fatalf("initial events: %v", got)
		}
		names = append(names, e.Name)
	}
	if want := []string{"p01", "p05", "p09", "p13", "p17"}; !slices.Equal(names, want) || got[5].Type != watch.Bookmark {
		t.Fatalf("initial events %v, want ADDED %v then the bookmark", got, want)
	}
	// Five objects on node-1, one field evaluation each; a scan of the
	// whole state would have made twenty.
	if n := sel.matches.Load(); n != 5 {
		t.Errorf("the watch-list computed the fields of %d objects, want the 5 with its trigger value", n)
	}
}

// countingSelector counts the objects a field selector is matched against.
type countingSelector struct {
	fields.Selector
	matches atomic.Int64
}

func (s *countingSelector) Matches(f fields.Fields) bool {
	s.matches.Add(1)
	return s.Selector.Matches(f)
}

// TestStatsOverProtobuf: over a storage that is not JSON, Stats counts
// the objects exactly, and their size is that of the cache's bytes: the
// storage's encoding with the resourceVersion, which etcd does not store.
// The conformance suite's Stats runs over JSON, where the size is etcd's.
func TestStatsOverProtobuf(t *testing.T) {
	ctx := context.Background()
	c := newTestCacher(t)
	var sizes int64
	for _, name := range []string{"a", "bb"} {
		out := &example.Pod{}
		if err := c.Create(ctx, "/pods/ns/"+name, &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}, out, 0); err != nil {
			t.Fatal(err)
		}
		raw, err := runtime.Encode(examplev1Blob, out)
		if err != nil {
			t.Fatal(err)
		}
		sizes += int64(len(raw))
	}
	if err := c.GetList(ctx, "/pods/", storage.ListOptions{Recursive: true, Predicate: storage.Everything}, &example.PodList{}); err != nil {
		t.Fatal(err)
	}
	got, err := c.Stats(ctx)
	if want := (storage.Stats{ObjectCount: 2, EstimatedAverageObjectSizeBytes: sizes / 2}); err != nil || got != want {
		t.Errorf("Stats = %+v, %v; want %+v", got, err, want)
	}
}
