package source

import (
	"fmt"
	"reflect"
	"testing"

	"k8s.io/apiserver/pkg/apis/example"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// TestBackfillSharesHeldObjects checks that a warm start's backfill replays
// etcd's history between its two lists, and that an event whose version
// the store holds from the start's list holds the store's object rather
// than a copy of it: after a start most of the history is the newest
// version of its key, and the copies doubled what it held.
func TestBackfillSharesHeldObjects(t *testing.T) {
	// etcd's history: a created at 2, b created at 3 and changed at 4.
	etcd := newFakeEtcd(4, pod("a", 2), pod("b", 4))
	etcd.at = map[uint64][]*example.Pod{1: nil}
	h := newHarness(etcd, nil)
	h.src.cfg.WarmStartRevisions = 10
	h.run(t)
	// The backfill watches from the oldest revision, 1; the follower from
	// the list's, 4. Either may open first.
	watches := map[string]openedWatch{}
	for len(watches) < 2 {
		o := etcd.next(t)
		watches[o.rv] = o
	}
	bf, ok := watches["1"]
	if !ok {
		t.Fatalf("watches opened after %v; want one after 1, the backfill's", reflect.ValueOf(watches).MapKeys())
	}
	bf.w.put(pod("a", 2))
	bf.w.put(pod("b", 3))
	bf.w.put(pod("b", 4))
	events, _ := testkit.Recv(t, h.cache.prepended, "the backfill's events")

	var got []string
	for _, e := range events {
		held, _ := h.cache.Get(e.Key)
		got = append(got, fmt.Sprintf("%s %s@%d shared=%v", e.Type, e.Key, e.Rev, e.Cur == held))
	}
	want := []string{"ADDED /pods/ns/a@2 shared=true", "ADDED /pods/ns/b@3 shared=false", "MODIFIED /pods/ns/b@4 shared=true"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("backfilled %q, want %q", got, want)
	}
	if events[2].Prev != events[1].Cur {
		t.Error("b's change at 4 does not replace the version its creation made")
	}
}
