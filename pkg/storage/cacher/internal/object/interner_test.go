package object

import (
	"maps"
	"slices"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

func sameString(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// TestInternerLabels: equal label sets are shared, up to the budget, and
// only equal ones, whatever their strings spell together; interning
// changes no value.
func TestInternerLabels(t *testing.T) {
	for _, tc := range []struct {
		name       string
		budget     int64
		a, b       labels.Set
		wantShared bool
	}{
		{name: "equal sets", budget: defaultInternBudget, a: labels.Set{"app": "agent", "tier": "edge"}, b: labels.Set{"tier": "edge", "app": "agent"}, wantShared: true},
		{name: "past the budget", budget: 0, a: labels.Set{"app": "agent"}, b: labels.Set{"app": "agent"}},
		{name: "the same characters otherwise split", budget: defaultInternBudget, a: labels.Set{"a": "bc"}, b: labels.Set{"ab": "c"}},
		{name: "another value", budget: defaultInternBudget, a: labels.Set{"app": "agent"}, b: labels.Set{"app": "agents"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInterner(tc.budget)
			wantA, wantB := maps.Clone(tc.a), maps.Clone(tc.b)
			a, b := in.labels(tc.a), in.labels(tc.b)
			if !maps.Equal(a.Set(), wantA) || !maps.Equal(b.Set(), wantB) {
				t.Fatalf("interning changed the sets: %v %v", a.Set(), b.Set())
			}
			if got := a == b; got != tc.wantShared {
				t.Errorf("shared: %v, want %v", got, tc.wantShared)
			}
		})
	}
}

// TestInternerFields: the fields an object keeps are its selectable fields
// but the name and the trigger, sorted, and shared when equal.
func TestInternerFields(t *testing.T) {
	in := newInterner(defaultInternBudget)
	f := fields.Set{"metadata.name": "a", "metadata.namespace": "ns", "spec.nodeName": "n1", "status.phase": "Running"}
	got := in.fields(f, "spec.nodeName")
	if want := []string{"metadata.namespace", "ns", "status.phase", "Running"}; got == nil || !slices.Equal(got.fields, want) {
		t.Fatalf("fields %v, want %q", got, want)
	}
	other := in.fields(fields.Set{"metadata.name": "b", "metadata.namespace": "ns", "spec.nodeName": "n2", "status.phase": "Running"}, "spec.nodeName")
	if other != got {
		t.Error("equal fields are not shared")
	}
	if third := in.fields(fields.Set{"metadata.namespace": "ns", "status.phase": "Done"}, ""); third == got || !sameString(third.fields[1], got.fields[1]) {
		t.Error("different fields are shared, or their equal strings are not")
	}
	if none := in.fields(fields.Set{"metadata.name": "a"}, ""); none != nil {
		t.Errorf("a name alone keeps %q", none)
	}
}
