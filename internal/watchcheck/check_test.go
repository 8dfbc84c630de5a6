package watchcheck

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
)

// obj is what the tests check of an object: its tier.
type obj struct{ tier string }

var (
	gold   = &obj{"gold"}
	silver = &obj{"silver"}
)

func all(*obj) bool                                      { return true }
func goldOnly(o *obj) bool                               { return o.tier == "gold" }
func it(typ watch.EventType, key string, rev int64) Item { return Item{typ, key, rev} }
func bookmark(rev int64) Item                            { return Item{watch.Bookmark, "", rev} }

// testChanges: a created (gold) at 2, b created (silver) at 3, a moved to
// silver at 4, b updated at 5, a deleted at 6, then a transaction at 7
// creating c, d and e, and a lease revoked at 8 deleting the three.
func testChanges() []Change[obj] {
	return []Change[obj]{
		{Rev: 2, Key: "a", Cur: gold},
		{Rev: 3, Key: "b", Cur: silver},
		{Rev: 4, Key: "a", Prev: gold, Cur: silver},
		{Rev: 5, Key: "b", Prev: silver, Cur: silver},
		{Rev: 6, Key: "a", Prev: silver},
		{Rev: 7, Key: "c", Cur: gold}, {Rev: 7, Key: "d", Cur: silver}, {Rev: 7, Key: "e", Cur: gold},
		{Rev: 8, Key: "c", Prev: gold}, {Rev: 8, Key: "d", Prev: silver}, {Rev: 8, Key: "e", Prev: gold},
	}
}

// TestCheckSegment feeds the checker streams with each kind of mistake
// and checks that it counts exactly that mistake.
func TestCheckSegment(t *testing.T) {
	correct := []Item{it(watch.Added, "a", 2), it(watch.Added, "b", 3), it(watch.Modified, "a", 4),
		it(watch.Modified, "b", 5), it(watch.Deleted, "a", 6),
		it(watch.Added, "c", 7), it(watch.Added, "d", 7), it(watch.Added, "e", 7),
		it(watch.Deleted, "c", 8), it(watch.Deleted, "d", 8), it(watch.Deleted, "e", 8)}
	without := func(i int) []Item { return append(append([]Item{}, correct[:i]...), correct[i+1:]...) }
	with := func(i int, extra ...Item) []Item {
		return append(append(append([]Item{}, correct[:i]...), extra...), correct[i:]...)
	}
	tests := []struct {
		name  string
		match func(*obj) bool
		from  int64
		items []Item
		want  Violations
	}{
		{name: "every event, in order", match: all, from: 1, items: correct},
		{name: "resumed from a list", match: all, from: 3, items: correct[2:]},
		{name: "missed", match: all, from: 1, items: without(2), want: Violations{Reliable: 1}},
		{name: "missed the first after a resume", match: all, from: 3, items: correct[3:], want: Violations{Resumable: 1, Reliable: 1}},
		{name: "duplicated", match: all, from: 1, items: with(3, correct[2]), want: Violations{Unique: 1}},
		{name: "reordered", match: all, from: 1, items: []Item{correct[0], correct[2], correct[1], correct[3]},
			want: Violations{Ordered: 1}},
		{name: "reordered inside a revision", match: all, from: 1,
			items: append(append([]Item{}, correct[:5]...), correct[6], correct[5], correct[7]), want: Violations{Ordered: 1}},
		{name: "phantom", match: all, from: 1, items: append(append([]Item{}, correct...), it(watch.Added, "z", 9)),
			want: Violations{Reliable: 1}},
		{name: "wrong type", match: all, from: 1, items: []Item{correct[0], correct[1], it(watch.Added, "a", 4), correct[3]},
			want: Violations{Reliable: 2}},
		{name: "leaving a selector is DELETED", match: goldOnly, from: 1,
			items: []Item{it(watch.Added, "a", 2), it(watch.Deleted, "a", 4)}},
		{name: "a revision's last event dropped", match: all, from: 1, items: without(7), want: Violations{Atomic: 1}},
		{name: "a revision selected in part", match: goldOnly, from: 6,
			items: []Item{it(watch.Added, "c", 7), it(watch.Added, "e", 7), it(watch.Deleted, "c", 8), it(watch.Deleted, "e", 8)}},
		{name: "ended inside its last revision", match: all, from: 1, items: correct[:9], want: Violations{Split: 1}},
		{name: "bookmark after the events it covers", match: all, from: 1, items: with(2, bookmark(3))},
		{name: "early bookmark", match: all, from: 1, items: with(1, bookmark(3)), want: Violations{Bookmarkable: 1}},
		{name: "bookmark inside a revision", match: all, from: 1, items: with(6, bookmark(7)), want: Violations{Bookmarkable: 1}},
		{name: "bookmark going back", match: all, from: 1, items: with(3, bookmark(2)), want: Violations{Bookmarkable: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckSegment("s", testChanges(), tc.match, Segment{From: tc.from, Items: tc.items})
			details := got.Details
			got.Details = nil
			if got.String() != tc.want.String() {
				t.Errorf("got %v, want %v: %v", got, tc.want, details)
			}
		})
	}
}

func TestCheckList(t *testing.T) {
	h := &History[obj]{Start: 1, Initial: map[string]Version[obj]{}, changes: testChanges()}
	tests := []struct {
		name  string
		start int64
		match func(*obj) bool
		list  List
		want  Violations
	}{
		{name: "equal at its resourceVersion", match: all, list: List{Rev: 4, Items: map[string]int64{"a": 4, "b": 3}}},
		{name: "selected", match: goldOnly, list: List{Rev: 3, Items: map[string]int64{"a": 2}}},
		{name: "a transaction's state", match: all, list: List{Rev: 7, Items: map[string]int64{"b": 5, "c": 7, "d": 7, "e": 7}}},
		{name: "part of a transaction", match: all, list: List{Rev: 7, Items: map[string]int64{"b": 5, "c": 7, "d": 7}},
			want: Violations{Lists: 1}},
		{name: "stale item", match: all, list: List{Rev: 4, Items: map[string]int64{"a": 2, "b": 3}}, want: Violations{Lists: 1}},
		{name: "deleted item", match: all, list: List{Rev: 6, Items: map[string]int64{"a": 4, "b": 5}}, want: Violations{Lists: 1}},
		{name: "consistent but older than an acknowledged write", match: all,
			list: List{Rev: 3, Items: map[string]int64{"a": 2, "b": 3}, MinRev: 4}, want: Violations{Consistent: 1}},
		{name: "before the history began", start: 5, match: all, list: List{Rev: 4, Items: map[string]int64{"a": 4, "b": 3}},
			want: Violations{Lists: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h.Start = max(tc.start, 1)
			got := CheckList(h, tc.match, tc.list)
			details := got.Details
			got.Details = nil
			if got.String() != tc.want.String() {
				t.Errorf("got %v, want %v: %v", got, tc.want, details)
			}
		})
	}
}

// TestListViolationNamesHistory checks that a list that differs from etcd
// says what etcd's history holds of the keys that differ, so that a
// violation found once can be explained from the log alone.
func TestListViolationNamesHistory(t *testing.T) {
	h := &History[obj]{Start: 1, Initial: map[string]Version[obj]{}, changes: testChanges()}
	v := CheckList(h, all, List{Who: "lister", Rev: 6, Items: map[string]int64{"a": 4, "b": 5}})
	want := "extra a@4]; in etcd, [a: absent at 1, written at 2, written at 4, deleted at 6]"
	if len(v.Details) != 1 || !strings.Contains(v.Details[0], want) {
		t.Fatalf("violation %q, want it to contain %q", v.Details, want)
	}
}
