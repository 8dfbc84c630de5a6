package cacher

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestExactItems(t *testing.T) {
	grown := make([]metav1.PartialObjectMetadata, 2, 8)
	grown[0].Name, grown[1].Name = "a", "b"
	items := make([]unstructured.Unstructured, 1, 3)
	items[0].SetName("u")
	for _, tc := range []struct {
		name    string
		list    runtime.Object
		wantLen int
		moved   bool
	}{
		{name: "grown typed list", list: &metav1.PartialObjectMetadataList{Items: grown}, wantLen: 2, moved: true},
		{name: "exact typed list", list: &metav1.PartialObjectMetadataList{Items: grown[:2:2]}, wantLen: 2},
		{name: "empty list", list: &metav1.PartialObjectMetadataList{}, wantLen: 0},
		{name: "unstructured list", list: &unstructured.UnstructuredList{Items: items}, wantLen: 1, moved: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.list.DeepCopyObject()
			before := firstItem(t, tc.list)
			if err := exactItems(tc.list); err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(tc.list, want) {
				t.Fatalf("the items changed: %v, want %v", tc.list, want)
			}
			ptr, _ := meta.GetItemsPtr(tc.list)
			n, c := sliceLenCap(ptr)
			if n != tc.wantLen || c != n {
				t.Errorf("len %d cap %d, want both %d", n, c, tc.wantLen)
			}
			if moved := before != nil && firstItem(t, tc.list) != before; moved != tc.moved {
				t.Errorf("moved to a new array: %v, want %v", moved, tc.moved)
			}
		})
	}
	if err := exactItems(&metav1.Status{}); err == nil {
		t.Error("no error for an object that is not a list")
	}
}

func firstItem(t *testing.T, list runtime.Object) runtime.Object {
	t.Helper()
	var first runtime.Object
	if err := meta.EachListItem(list, func(o runtime.Object) error {
		if first == nil {
			first = o
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return first
}

func sliceLenCap(ptr any) (int, int) {
	v := reflect.ValueOf(ptr).Elem()
	return v.Len(), v.Cap()
}

func TestRehomeAnnotations(t *testing.T) {
	in := newInterner(defaultInternBudget)
	a, b := decodedMeta(t, "a", "one"), decodedMeta(t, "b", "two")
	none := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "none"}}
	for _, m := range []*metav1.PartialObjectMetadata{a, b} {
		in.object(m)
	}
	decodedA := a.Annotations
	want := []*metav1.PartialObjectMetadata{a.DeepCopy(), b.DeepCopy(), none.DeepCopy()}
	rehomeAnnotations([]*object{{obj: a}, {obj: b}, {obj: none}})
	for i, m := range []*metav1.PartialObjectMetadata{a, b, none} {
		if !equality.Semantic.DeepEqual(m, want[i]) {
			t.Errorf("%s changed: %v, want %v", m.Name, m, want[i])
		}
	}
	if sameMap(a.Annotations, decodedA) {
		t.Error("the annotations are still in the decoded map")
	}
	if !sameKey(a.Annotations, b.Annotations, "note") {
		t.Error("the copied maps no longer share the interned key")
	}
	if none.Annotations != nil {
		t.Errorf("an object without annotations got %v", none.Annotations)
	}
}
