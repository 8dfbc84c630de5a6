package object

import (
	"fmt"
	"maps"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

// TestLabels: a set as sorted pairs answers as the map it was made from,
// by comparing each key below linearLabels and by binary search above.
func TestLabels(t *testing.T) {
	many := labels.Set{}
	for i := range 3 * linearLabels {
		many[fmt.Sprintf("k%02d", i)] = fmt.Sprintf("v%d", i)
	}
	for _, tc := range []struct {
		name string
		set  labels.Set
	}{
		{name: "none"},
		{name: "one", set: labels.Set{"app": "web"}},
		{name: "a few", set: labels.Set{"tier": "front", "app": "web", "a": "", "zone": "b"}},
		{name: "as many as compared in turn", set: func() labels.Set {
			s := labels.Set{}
			for i := range linearLabels {
				s[fmt.Sprintf("k%d", i)] = "v"
			}
			return s
		}()},
		{name: "searched", set: many},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLabels(tc.set)
			if got := l.Set(); !maps.Equal(got, tc.set) && len(got)+len(tc.set) > 0 {
				t.Fatalf("Set() = %v, want %v", got, tc.set)
			}
			if l.Len() != len(tc.set) {
				t.Errorf("Len() = %d, want %d", l.Len(), len(tc.set))
			}
			for k, want := range tc.set {
				if v, ok := l.Lookup(k); !ok || v != want || !l.Has(k) || l.Get(k) != want {
					t.Errorf("Lookup(%q) = %q, %v, want %q", k, v, ok, want)
				}
			}
			for _, k := range []string{"", "absent", "k", "k99", "zzz", "0"} {
				if _, in := tc.set[k]; in {
					continue
				}
				if v, ok := l.Lookup(k); ok || l.Has(k) {
					t.Errorf("Lookup(%q) = %q, true for a key the set lacks", k, v)
				}
			}
			prev := ""
			for k := range l.All() {
				if k < prev {
					t.Errorf("All() yields %q after %q", k, prev)
				}
				prev = k
			}
		})
	}
}

// TestLabelsMatchWithoutAllocating: a selector matches an object's labels
// without an allocation, which a slice in the interface would cost each
// object a list or an event filters.
func TestLabelsMatchWithoutAllocating(t *testing.T) {
	l := NewLabels(labels.Set{"app": "web", "tier": "front"})
	sel := labels.SelectorFromSet(labels.Set{"tier": "front"})
	var o Object
	o.SetLabels(l)
	if n := testing.AllocsPerRun(100, func() {
		if !sel.Matches(o.Labels()) {
			t.Fatal("no match")
		}
	}); n != 0 {
		t.Errorf("a match allocates %v times", n)
	}
}
