package cacher

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
)

// TestObjectFields checks that field selectors match an object's fields,
// made by the presenter, as they match the fields.Set that GetAttrsFunc
// returns; that the fields are computed at most once however many
// selectors read them; and not at all for the trigger field or the name,
// which the object keeps, nor for a predicate without a field selector.
func TestObjectFields(t *testing.T) {
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", Labels: map[string]string{"app": "x"}},
		Spec: example.PodSpec{NodeName: "node-1"}}
	_, set, _ := podAttrs(pod)
	o := &object{key: "/pods/ns/a", name: "a", obj: pod, labels: pod.Labels, trigger: pod.Spec.NodeName}
	computed := 0
	pr := &presenter{trigger: "spec.nodeName", attrs: func(obj runtime.Object) (labels.Set, fields.Set, error) {
		computed++
		return podAttrs(obj)
	}}
	for _, tc := range []struct {
		selector string
		want     bool
		// computes is whether matching it needs more than the trigger field.
		computes bool
	}{
		{"spec.nodeName=node-1", true, false},
		{"spec.nodeName=node-2", false, false},
		{"spec.nodeName!=node-2", true, false},
		{"metadata.namespace=ns,metadata.name=a", true, true},
		{"metadata.name!=a", false, false},
		{"metadata.name=a", true, false},
		{"status.phase=", true, true},
		{"status.phase!=", false, true},
		{"spec.missing=", true, true},
		{"spec.missing=x", false, true},
		{"spec.nodeName=node-1,metadata.name=b", false, false},
		{"spec.nodeName=node-1,status.phase=x", false, true},
	} {
		t.Run(tc.selector, func(t *testing.T) {
			sel, err := fields.ParseSelector(tc.selector)
			if err != nil {
				t.Fatal(err)
			}
			p := &filter{pred: &storage.SelectionPredicate{Label: labels.Everything(), Field: sel}}
			computed = 0
			f := pr.fields(o)
			for range 3 {
				if got, want := p.matches(o, pr, f), sel.Matches(set); got != tc.want || want != tc.want {
					t.Errorf("objectFields %v, fields.Set %v, want %v", got, want, tc.want)
				}
			}
			if want := map[bool]int{false: 0, true: 1}[tc.computes]; computed != want {
				t.Errorf("fields computed %d times for 3 matches, want %d", computed, want)
			}
		})
	}
	computed = 0
	for _, p := range []*storage.SelectionPredicate{nil, {Label: labels.Everything(), Field: fields.Everything()},
		{Label: labels.SelectorFromSet(labels.Set{"app": "y"}), Field: fields.OneTermEqualSelector("spec.restartPolicy", "a")}} {
		var f *filter
		if p != nil {
			f = &filter{pred: p}
		}
		f.matches(o, pr, nil)
	}
	if computed != 0 {
		t.Errorf("fields computed %d times for no field selector, or one after a label that does not match", computed)
	}
}

// TestPresenterFieldsError checks that an object whose fields cannot be
// computed matches no selector that needs them, and does not panic.
func TestPresenterFieldsError(t *testing.T) {
	pr := &presenter{attrs: func(runtime.Object) (labels.Set, fields.Set, error) { return nil, nil, fmt.Errorf("broken") }}
	o := &object{key: "/pods/ns/a", obj: &example.Pod{}}
	p := &filter{pred: &storage.SelectionPredicate{Label: labels.Everything(), Field: fields.OneTermEqualSelector("spec.restartPolicy", "a")}}
	if p.matches(o, pr, nil) {
		t.Error("an object without fields matched spec.restartPolicy=a")
	}
}
