package cacher

import (
	"encoding/json"
	"strings"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

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

func TestFieldSet(t *testing.T) {
	set := fields.Set{"metadata.name": "a", "metadata.namespace": "ns", "spec.agentName": "agent-1", "status.phase": ""}
	f := newFieldSet(set)
	for _, tc := range []struct {
		selector string
		want     bool
	}{
		{"spec.agentName=agent-1", true},
		{"spec.agentName=agent-2", false},
		{"spec.agentName!=agent-2", true},
		{"metadata.namespace=ns,metadata.name=a", true},
		{"status.phase=", true},
		{"status.phase!=", false},
		{"spec.missing=", true},
		{"spec.missing=x", false},
	} {
		sel, err := fields.ParseSelector(tc.selector)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := sel.Matches(f), sel.Matches(set); got != tc.want || want != tc.want {
			t.Errorf("%s: fieldSet %v, fields.Set %v, want %v", tc.selector, got, want, tc.want)
		}
	}
	if newFieldSet(nil) != nil || newFieldSet(fields.Set{}).Has("x") {
		t.Errorf("an empty set has fields")
	}
}
