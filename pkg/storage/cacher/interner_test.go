package cacher

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/google/go-cmp/cmp"
)

// decodedMeta returns a freshly decoded object with the metadata an API
// server writes, as the cache gets it from etcd.
func decodedMeta(t *testing.T, name, annotation string) *metav1.PartialObjectMetadata {
	t.Helper()
	raw := `{"metadata":{"name":"` + name + `","namespace":"team-a","labels":{"app":"agent","tier":"edge"},
		"annotations":{"note":"` + annotation + `"},"finalizers":["fleet.example.com/cleanup"],
		"ownerReferences":[{"apiVersion":"fleet.example.com/v1beta1","kind":"Agent","name":"agent-one","uid":"u"}],
		"managedFields":[{"manager":"agent","operation":"Update","apiVersion":"fleet.example.com/v1beta1",
		"time":"2026-11-22T10:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{"f:app":{}}}}}]}}`
	var obj metav1.PartialObjectMetadata
	if err := json.Unmarshal([]byte(raw), &obj); err != nil {
		t.Fatal(err)
	}
	return &obj
}

func sameString(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

func TestInterner(t *testing.T) {
	for _, tc := range []struct {
		name       string
		budget     int64
		wantShared bool
	}{
		{name: "shares equal metadata", budget: defaultInternBudget, wantShared: true},
		{name: "shares nothing past its budget", budget: 0, wantShared: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInterner(tc.budget)
			a, b := decodedMeta(t, "a", strings.Repeat("x", 64)), decodedMeta(t, "b", strings.Repeat("x", 64))
			wantA, wantB := a.DeepCopy(), b.DeepCopy()
			in.object(a)
			in.object(b)
			// Interning changes no value.
			if !equality.Semantic.DeepEqual(a, wantA) || !equality.Semantic.DeepEqual(b, wantB) {
				t.Fatalf("interning changed the objects: %s", cmp.Diff(wantA, a))
			}
			shared := map[string]bool{
				"namespace":             sameString(a.Namespace, b.Namespace),
				"label key":             sameKey(a.Labels, b.Labels, "app"),
				"label value":           sameString(a.Labels["tier"], b.Labels["tier"]),
				"annotation key":        sameKey(a.Annotations, b.Annotations, "note"),
				"finalizer":             sameString(a.Finalizers[0], b.Finalizers[0]),
				"owner kind":            sameString(a.OwnerReferences[0].Kind, b.OwnerReferences[0].Kind),
				"manager":               sameString(a.ManagedFields[0].Manager, b.ManagedFields[0].Manager),
				"managed apiVersion":    sameString(a.ManagedFields[0].APIVersion, b.ManagedFields[0].APIVersion),
				"managed time":          a.ManagedFields[0].Time == b.ManagedFields[0].Time,
				"managed fields":        a.ManagedFields[0].FieldsV1 == b.ManagedFields[0].FieldsV1,
				"label set":             sameMap(a.Labels, b.Labels),
				"managedFields list":    &a.ManagedFields[0] == &b.ManagedFields[0],
				"annotation value":      sameString(a.Annotations["note"], b.Annotations["note"]),
				"owner name (not kept)": sameString(a.OwnerReferences[0].Name, b.OwnerReferences[0].Name),
			}
			for what, got := range shared {
				want := tc.wantShared
				if what == "annotation value" || what == "owner name (not kept)" {
					want = false // data, not interned
				}
				if got != want {
					t.Errorf("%s shared: %v, want %v", what, got, want)
				}
			}
		})
	}
}

// TestInternerKeepsDifferentSetsApart: label sets and managedFields lists
// are shared only when equal, whatever their strings spell together.
func TestInternerKeepsDifferentSetsApart(t *testing.T) {
	in := newInterner(defaultInternBudget)
	a, b, c := decodedMeta(t, "a", "x"), decodedMeta(t, "b", "x"), decodedMeta(t, "c", "x")
	b.Labels = map[string]string{"app": "agent", "tier": "core"}
	b.ManagedFields[0].Time = &metav1.Time{Time: a.ManagedFields[0].Time.Add(time.Second)}
	// The same characters in another order of keys and values.
	a.Labels, c.Labels = map[string]string{"a": "bc"}, map[string]string{"ab": "c"}
	c.ManagedFields[0].Manager, c.ManagedFields[0].Operation = "agentUpdate", ""
	want := []*metav1.PartialObjectMetadata{a.DeepCopy(), b.DeepCopy(), c.DeepCopy()}
	for i, obj := range []*metav1.PartialObjectMetadata{a, b, c} {
		in.object(obj)
		if !equality.Semantic.DeepEqual(obj, want[i]) {
			t.Fatalf("interning changed %s: %s", obj.Name, cmp.Diff(want[i], obj))
		}
	}
	if sameMap(a.Labels, c.Labels) || &a.ManagedFields[0] == &b.ManagedFields[0] || &a.ManagedFields[0] == &c.ManagedFields[0] {
		t.Error("different label sets or managedFields lists are shared")
	}
	// Their equal parts still are.
	if !sameString(a.ManagedFields[0].Manager, b.ManagedFields[0].Manager) || a.ManagedFields[0].FieldsV1 != b.ManagedFields[0].FieldsV1 {
		t.Error("equal parts of different managedFields lists are not shared")
	}
	// A fourth object equal to the second shares its label set and list.
	d := decodedMeta(t, "d", "x")
	d.Labels = map[string]string{"tier": "core", "app": "agent"}
	d.ManagedFields[0].Time = &metav1.Time{Time: b.ManagedFields[0].Time.Time}
	in.object(d)
	if !sameMap(b.Labels, d.Labels) || &b.ManagedFields[0] != &d.ManagedFields[0] {
		t.Error("equal label sets or managedFields lists are not shared")
	}
}

func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func sameKey(a, b map[string]string, key string) bool {
	var ka, kb string
	for k := range a {
		if k == key {
			ka = k
		}
	}
	for k := range b {
		if k == key {
			kb = k
		}
	}
	return ka != "" && sameString(ka, kb)
}
