package fanout

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// TestObjectFields checks that field selectors match an object's fields,
// made by the presenter, as they match the fields.Set that GetAttrsFunc
// returns; that the fields are computed at most once however many
// selectors read them; and not at all for the trigger field or the name,
// which the object keeps, nor for a predicate without a field selector.
func TestObjectFields(t *testing.T) {
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", Labels: map[string]string{"app": "x"}},
		Spec: example.PodSpec{NodeName: "node-1"}}
	_, set, _ := objecttest.PodAttrs(pod)
	o := objecttest.PodObject(pod)
	pr := &Presenter{trigger: "spec.nodeName", codec: objecttest.Pods.Codec()}
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
			p := &Filter{pred: &storage.SelectionPredicate{Label: labels.Everything(), Field: sel}}
			f := pr.fields(o)
			for range 3 {
				if got, want := p.Matches(o, pr, f), sel.Matches(set); got != tc.want || want != tc.want {
					t.Errorf("objectFields %v, fields.Set %v, want %v", got, want, tc.want)
				}
			}
			if f.done != tc.computes {
				t.Errorf("fields computed: %v, want %v", f.done, tc.computes)
			}
		})
	}
	for _, p := range []*storage.SelectionPredicate{nil, {Label: labels.Everything(), Field: fields.Everything()},
		{Label: labels.SelectorFromSet(labels.Set{"app": "y"}), Field: fields.OneTermEqualSelector("spec.restartPolicy", "a")}} {
		var f *Filter
		if p != nil {
			f = &Filter{pred: p}
		}
		fs := pr.fields(o)
		f.Matches(o, pr, fs)
		if fs.done {
			t.Errorf("fields computed for %v: no field selector, or one after a label that does not match", p)
		}
	}
}

// TestSharedKeepsItsObject checks that a shared object, such as a bookmark,
// gives encoders that need a Go object the object it was made from, not its
// bytes decoded: a decoder defaults what it decodes, and a bookmark's empty
// object, defaulted, no longer encoded as its bytes, which taught the watch
// encoder that first compared them that it does not write them
// (object.TestMadeObjectsLearntAsTheirBytes).
func TestSharedKeepsItsObject(t *testing.T) {
	pr := NewPresenter("", objecttest.Pods.Codec(), nil)
	bookmark := &example.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "5"}}
	shared, ok := pr.shared(bookmark, 5).(metav1.ObjectMetaAccessor)
	if !ok {
		t.Fatalf("shared is %T, not a cached object", shared)
	}
	if got := shared.GetObjectMeta(); got != metav1.Object(bookmark) {
		t.Fatalf("the shared object's metadata is %#v, not its own object's: its bytes were decoded", got)
	}
}
