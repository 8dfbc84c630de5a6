package store

import (
	"slices"
	"strings"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// TestSet checks a set through its forms: empty, one object held without
// a map, and a map from the second object on, down to empty again.
func TestSet(t *testing.T) {
	a, b, c := &object.Object{Key: "a"}, &object.Object{Key: "b"}, &object.Object{Key: "c"}
	type op struct {
		add bool
		o   *object.Object
	}
	tests := []struct {
		name string
		ops  []op
		want []*object.Object
	}{
		{name: "empty", want: nil},
		{name: "one", ops: []op{{true, a}}, want: []*object.Object{a}},
		{name: "one added twice", ops: []op{{true, a}, {true, a}}, want: []*object.Object{a}},
		{name: "two", ops: []op{{true, a}, {true, b}}, want: []*object.Object{a, b}},
		{name: "three less one", ops: []op{{true, a}, {true, b}, {true, c}, {false, b}}, want: []*object.Object{a, c}},
		{name: "one removed", ops: []op{{true, a}, {false, a}}, want: nil},
		{name: "another removed", ops: []op{{true, a}, {false, b}}, want: []*object.Object{a}},
		{name: "two removed", ops: []op{{true, a}, {true, b}, {false, a}, {false, b}}, want: nil},
		{name: "emptied map refilled", ops: []op{{true, a}, {true, b}, {false, a}, {false, b}, {true, c}}, want: []*object.Object{c}},
		{name: "replaced", ops: []op{{true, a}, {false, a}, {true, b}}, want: []*object.Object{b}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &set{}
			for _, op := range tc.ops {
				if op.add {
					s.add(op.o)
				} else {
					s.remove(op.o)
				}
			}
			got := slices.SortedFunc(s.all(), func(x, y *object.Object) int { return strings.Compare(x.Key, y.Key) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("set holds %v, want %v", keys(got), keys(tc.want))
			}
			if s.empty() != (len(tc.want) == 0) {
				t.Errorf("empty() = %v with %v", s.empty(), keys(got))
			}
		})
	}
}
