package cacher

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
)

// heldList holds the cache's own initial list (the only list with its page
// size) until released, so that the cache stays not ready.
type heldList struct {
	storage.Interface
	release chan struct{}
}

func (h *heldList) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	if opts.Predicate.Limit == listPageSize {
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
