package source

import (
	"fmt"
	"reflect"
	"testing"

	"k8s.io/apiserver/pkg/apis/example"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
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
		// The event's key is its object's string, not a copy of it.
		got = append(got, fmt.Sprintf("%s %s@%d shared=%v key=%v", e.Type, e.Key, e.Rev, e.Cur == held, sameString(e.Key, e.Cur.Key)))
	}
	want := []string{"ADDED /pods/ns/a@2 shared=true key=true", "ADDED /pods/ns/b@3 shared=false key=true",
		"MODIFIED /pods/ns/b@4 shared=true key=true"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("backfilled %q, want %q", got, want)
	}
	if events[2].Prev != events[1].Cur {
		t.Error("b's change at 4 does not replace the version its creation made")
	}
}

// TestBackfillHoldsWhatTheLogTakes checks that a backfill holds no more
// than the log it fills takes, by events and by bytes: the newest whole
// revisions, and that it promises nothing older, so that a watch from
// before what it kept gets 410 rather than a wait.
func TestBackfillHoldsWhatTheLogTakes(t *testing.T) {
	tests := []struct {
		name string
		// bound sets the backfill's bounds, given the size of one object.
		bound    func(cfg *Config, size int64)
		want     []string
		wantFrom uint64
	}{
		{name: "unbounded", bound: func(*Config, int64) {},
			want: []string{"a@2", "b@3", "c@4", "b@5"}, wantFrom: 1},
		{name: "two events", bound: func(c *Config, _ int64) { c.BackfillEvents = 2 },
			want: []string{"c@4", "b@5"}, wantFrom: 3},
		{name: "the bytes of two and a half objects", bound: func(c *Config, size int64) { c.BackfillBytes = size * 5 / 2 },
			want: []string{"c@4", "b@5"}, wantFrom: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// etcd's history: a, b and c created at 2, 3 and 4, b changed at 5.
			etcd := newFakeEtcd(5, pod("a", 2), pod("b", 5), pod("c", 4))
			etcd.at = map[uint64][]*example.Pod{1: nil}
			size, err := objecttest.Pods.Build(pod("a", 2))
			if err != nil {
				t.Fatal(err)
			}
			h := newHarnessWith(etcd, nil, func(c *Config) {
				c.WarmStartRevisions = 10
				tc.bound(c, size.Size())
			})
			h.run(t)
			watches := map[string]openedWatch{}
			for len(watches) < 2 {
				o := etcd.next(t)
				watches[o.rv] = o
			}
			bf := watches["1"]
			bf.w.put(pod("a", 2))
			bf.w.put(pod("b", 3))
			bf.w.put(pod("c", 4))
			bf.w.put(pod("b", 5))
			events, _ := testkit.Recv(t, h.cache.prepended, "the backfill's events")
			var got []string
			for _, e := range events {
				got = append(got, fmt.Sprintf("%s@%d", e.Key[len("/pods/ns/"):], e.Rev))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("backfilled %q, want %q", got, tc.want)
			}
			if from := h.cache.prependedFrom.Load(); from != tc.wantFrom {
				t.Errorf("the events follow %d, want %d", from, tc.wantFrom)
			}
			if from := h.src.backfill.Load().from.Load(); from != tc.wantFrom {
				t.Errorf("the backfill promises from %d, want %d", from, tc.wantFrom)
			}
		})
	}
}
