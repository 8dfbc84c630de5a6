package source

import (
	"context"
	"testing"

	"k8s.io/apiserver/pkg/apis/example"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// TestListShares checks that a list with share takes the store's object
// for an item at the version the store holds, and builds the others; that
// the store's objects keep their bytes where they were (a page packs only
// what it built: objects the store shares are immutable); and that a list
// without share builds every item.
func TestListShares(t *testing.T) {
	etcd := newFakeEtcd(4)
	// The state at 3: a at 2, b at 3. The store holds a at 2 and b at 4.
	etcd.at = map[uint64][]*example.Pod{3: {pod("a", 2), pod("b", 3)}}
	h := newHarness(etcd, nil)
	var held []*object.Object
	for _, p := range []*example.Pod{pod("a", 2), pod("b", 4)} {
		o, err := objecttest.Pods.Build(p)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, o)
	}
	h.cache.Reset(held, 4)
	aBytes := &held[0].Raw[0]

	tests := []struct {
		name  string
		share bool
		// shared says, for a and b, whether the list holds the store's.
		shared [2]bool
	}{
		{name: "shared", share: true, shared: [2]bool{true, false}},
		{name: "not shared", share: false, shared: [2]bool{false, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, rv, err := h.src.listAt(context.Background(), 3, tc.share)
			if err != nil || rv != 3 || len(objs) != 2 {
				t.Fatalf("listed %d objects at %d, %v; want 2 at 3", len(objs), rv, err)
			}
			for i, o := range objs {
				if got := o == held[i]; got != tc.shared[i] || o.Key != held[i].Key {
					t.Errorf("%s: the store's object: %v, want %v", o.Key, got, tc.shared[i])
				}
			}
			if objs[1].RV != 3 {
				t.Errorf("b listed at %d, want 3", objs[1].RV)
			}
			if &held[0].Raw[0] != aBytes {
				t.Error("the list moved the bytes of an object the store holds")
			}
		})
	}
}
