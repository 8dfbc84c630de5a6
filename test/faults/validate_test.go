package faults

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
)

// history: a created (gold) at 2, b created (silver) at 3, a moved to
// silver at 4, b updated at 5, a deleted at 6.
func testHistory() []truthEvent {
	gold := map[string]string{"tier": "gold"}
	silver := map[string]string{"tier": "silver"}
	a2 := &objState{key: "ns/a", namespace: "ns", name: "a", rv: 2, labels: gold}
	b3 := &objState{key: "ns/b", namespace: "ns", name: "b", rv: 3, labels: silver}
	a4 := &objState{key: "ns/a", namespace: "ns", name: "a", rv: 4, labels: silver}
	b5 := &objState{key: "ns/b", namespace: "ns", name: "b", rv: 5, labels: silver}
	return []truthEvent{
		{rv: 2, key: "ns/a", cur: a2},
		{rv: 3, key: "ns/b", cur: b3},
		{rv: 4, key: "ns/a", prev: a2, cur: a4},
		{rv: 5, key: "ns/b", prev: b3, cur: b5},
		{rv: 6, key: "ns/a", prev: a4},
	}
}

func ev(typ watch.EventType, key string, rv int64) received {
	return received{typ: typ, key: key, rv: rv}
}

// TestValidateSegment feeds the validator streams with each kind of
// mistake and checks it counts exactly that mistake.
func TestValidateSegment(t *testing.T) {
	all := selector{}
	gold := selector{label: "tier=gold"}
	correct := []received{ev(watch.Added, "ns/a", 2), ev(watch.Added, "ns/b", 3), ev(watch.Modified, "ns/a", 4),
		ev(watch.Modified, "ns/b", 5), ev(watch.Deleted, "ns/a", 6)}
	tests := []struct {
		name   string
		sel    selector
		from   int64
		events []received
		want   violations
	}{
		{name: "every event, in order", sel: all, from: 1, events: correct},
		{name: "resumed from a list", sel: all, from: 3, events: correct[2:]},
		{name: "missed", sel: all, from: 1, events: append(append([]received{}, correct[:2]...), correct[3:]...),
			want: violations{missed: 1}},
		{name: "duplicated", sel: all, from: 1, events: append(append([]received{}, correct[:3]...), correct[2:]...),
			want: violations{duplicated: 1, outOfOrder: 1}},
		{name: "reordered", sel: all, from: 1, events: []received{correct[0], correct[2], correct[1], correct[3], correct[4]},
			want: violations{outOfOrder: 1}},
		{name: "phantom", sel: all, from: 1, events: append(append([]received{}, correct...), ev(watch.Added, "ns/c", 7)),
			want: violations{unexpected: 1, missed: 0}},
		{name: "wrong type", sel: all, from: 1, events: []received{correct[0], correct[1], ev(watch.Added, "ns/a", 4), correct[3], correct[4]},
			want: violations{unexpected: 1, missed: 1}},
		{name: "leaving a label selector is DELETED", sel: gold, from: 1,
			events: []received{ev(watch.Added, "ns/a", 2), ev(watch.Deleted, "ns/a", 4)}},
		{name: "leaving a label selector as MODIFIED", sel: gold, from: 1,
			events: []received{ev(watch.Added, "ns/a", 2), ev(watch.Modified, "ns/a", 4)},
			want:   violations{unexpected: 1, missed: 1}},
		{name: "bookmark after the events it covers", sel: all, from: 1,
			events: []received{correct[0], correct[1], ev(watch.Bookmark, "", 3), correct[2], correct[3], correct[4]}},
		{name: "early bookmark", sel: all, from: 1,
			events: []received{correct[0], ev(watch.Bookmark, "", 3), correct[1], correct[2], correct[3], correct[4]},
			want:   violations{bookmarks: 1}},
		{name: "bookmark going back", sel: all, from: 1,
			events: []received{correct[0], correct[1], correct[2], ev(watch.Bookmark, "", 3), correct[3], correct[4]},
			want:   violations{bookmarks: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := newMatcher(tc.sel)
			if err != nil {
				t.Fatal(err)
			}
			got := validateSegment("s", testHistory(), m, &segment{from: tc.from, events: tc.events})
			details := got.details
			got.details = nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v: %v", got, tc.want, details)
			}
		})
	}
}

func TestValidateList(t *testing.T) {
	tr := &truth{initial: map[string]*objState{}, events: testHistory()}
	tests := []struct {
		name       string
		truthStart int64
		list       listResult
		want       int
	}{
		{name: "equal at its resourceVersion", list: listResult{rv: 4, items: map[string]int64{"ns/a": 4, "ns/b": 3}}},
		{name: "selected", list: listResult{rv: 3, sel: selector{label: "tier=gold"}, items: map[string]int64{"ns/a": 2}}},
		{name: "stale item", list: listResult{rv: 4, items: map[string]int64{"ns/a": 2, "ns/b": 3}}, want: 1},
		{name: "missing item", list: listResult{rv: 4, items: map[string]int64{"ns/b": 3}}, want: 1},
		{name: "deleted item", list: listResult{rv: 6, items: map[string]int64{"ns/a": 4, "ns/b": 5}}, want: 1},
		{name: "consistent but older than an acknowledged write", list: listResult{rv: 3, items: map[string]int64{"ns/a": 2, "ns/b": 3},
			consistent: true, minRV: 4}, want: 1},
		// The truth below begins at 0; this one at 5 cannot tell the state at 4.
		{name: "before the truth began", truthStart: 5, list: listResult{rv: 4, items: map[string]int64{"ns/a": 4, "ns/b": 3}}, want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr.start = tc.truthStart
			if got := validateList(tr, tc.list).lists; got != tc.want {
				t.Errorf("list violations = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestListViolationNamesHistory checks that a list that differs from etcd
// says what etcd's history holds of the keys that differ, so that a
// violation found once can be explained from the log alone.
func TestListViolationNamesHistory(t *testing.T) {
	tr := &truth{initial: map[string]*objState{}, events: testHistory()}
	v := validateList(tr, listResult{who: "lister", rv: 6, items: map[string]int64{"ns/a": 4, "ns/b": 5}})
	want := "extra ns/a@4]; in etcd, ns/a: absent at 0, written at 2, written at 4, deleted at 6"
	if len(v.details) != 1 || !strings.Contains(v.details[0], want) {
		t.Fatalf("violation %q, want it to contain %q", v.details, want)
	}
}
