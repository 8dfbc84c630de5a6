package cacher

import (
	"context"
	"strings"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// TestListExpiredContinuation replaces upstream's
// RunTestListInconsistentContinuation (see conformance_test.go) with a
// well-formed update: limit is honoured at resourceVersion "0", a token
// older than etcd's compaction gets 410 with a fresh token, and the fresh
// token continues with a consistent read.
func TestListExpiredContinuation(t *testing.T) {
	c := newTestCacher(t)
	cw := createWrapper{c}
	ctx := context.Background()
	var last example.Pod
	for _, key := range []string{"/pods/first/bar", "/pods/second/bar", "/pods/second/foo"} {
		parts := strings.Split(key, "/")
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: parts[2], Name: parts[3]}}
		if err := cw.Create(ctx, key, pod, &last, 0); err != nil {
			t.Fatal(err)
		}
	}
	page := func(rv, token string, limit int64) (*example.PodList, error) {
		out := &example.PodList{}
		err := c.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: rv, Recursive: true,
			Predicate: storage.SelectionPredicate{Label: storage.Everything.Label, Field: storage.Everything.Field, Limit: limit, Continue: token}}, out)
		return out, err
	}
	first, err := page("0", "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Items) != 1 || first.Continue == "" || first.Items[0].Name != "bar" || first.Items[0].Namespace != "first" {
		t.Fatalf("first page at RV 0 with limit 1: %d items, continue %q", len(first.Items), first.Continue)
	}

	updated := &example.Pod{}
	if err := c.GuaranteedUpdate(ctx, "/pods/second/foo", updated, false, nil,
		storage.SimpleUpdate(func(obj runtime.Object) (runtime.Object, error) {
			pod := obj.(*example.Pod)
			pod.Labels = map[string]string{"state": "new"}
			return pod, nil
		}), nil); err != nil {
		t.Fatal(err)
	}
	c.compactStore(ctx, t, updated.ResourceVersion)

	_, err = page("", first.Continue, 0)
	if !apierrors.IsResourceExpired(err) || !strings.Contains(err.Error(), "The provided continue parameter is too old") {
		t.Fatalf("old token after compaction: got %v, want 410 Expired", err)
	}
	fresh := err.(apierrors.APIStatus).Status().ListMeta.Continue
	if fresh == "" {
		t.Fatal("the 410 must carry a fresh continue token")
	}
	second, err := page("", fresh, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Items) != 1 || second.Items[0].Namespace != "second" || second.Items[0].Name != "bar" || second.Continue == "" {
		t.Fatalf("second page: %v, continue %q", second.Items, second.Continue)
	}
	third, err := page("", second.Continue, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(third.Items) != 1 || third.Items[0].Labels["state"] != "new" || third.Continue != "" {
		t.Fatalf("third page: %v, continue %q; want the updated foo and no more pages", third.Items, third.Continue)
	}
	if third.ResourceVersion != second.ResourceVersion {
		t.Fatalf("pages after the fresh token disagree on resourceVersion: %s and %s", second.ResourceVersion, third.ResourceVersion)
	}
}

// sharingPodList takes the cache's objects through ShareItems.
type sharingPodList struct {
	example.PodList
	shared []runtime.Object
}

func (l *sharingPodList) ShareItems(objs []runtime.Object) { l.shared = objs }

// TestSharingList: every list served from the cache hands a SharingList the
// cached objects themselves, the same pointers to every list, and gives any
// other list copies that a caller may change.
func TestSharingList(t *testing.T) {
	c := newTestCacher(t, withNodeNameIndex)
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: example.PodSpec{NodeName: "n1"}}
		if err := c.Create(ctx, "/pods/ns/"+name, pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	onNode, err := fields.ParseSelector("spec.nodeName=n1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts storage.ListOptions
		want int
	}{
		{"consistent", storage.ListOptions{Recursive: true, Predicate: storage.Everything}, 3},
		{"rv 0", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, 3},
		{"by index", storage.ListOptions{Recursive: true, Predicate: storage.SelectionPredicate{
			Label: labels.Everything(), Field: onNode, GetAttrs: podAttrs, IndexFields: []string{"spec.nodeName"}}}, 3},
		{"a page", storage.ListOptions{Recursive: true, Predicate: storage.SelectionPredicate{
			Label: labels.Everything(), Field: fields.Everything(), GetAttrs: podAttrs, Limit: 2}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			list := func() *sharingPodList {
				l := &sharingPodList{}
				if err := c.GetList(ctx, "/pods/", tc.opts, l); err != nil {
					t.Fatal(err)
				}
				if len(l.shared) != tc.want || len(l.Items) != 0 {
					t.Fatalf("got %d shared objects and %d copied items, want %d shared", len(l.shared), len(l.Items), tc.want)
				}
				return l
			}
			first, second := list(), list()
			for i := range first.shared {
				if first.shared[i] != second.shared[i] {
					t.Errorf("item %d: two lists got different objects, so the cache copied them", i)
				}
			}
			copied := &example.PodList{}
			if err := c.GetList(ctx, "/pods/", tc.opts, copied); err != nil {
				t.Fatal(err)
			}
			if len(copied.Items) != tc.want {
				t.Fatalf("a plain list got %d items, want %d", len(copied.Items), tc.want)
			}
			// A shared item decodes to the plain list's item.
			if shared := objecttest.DecodedPod(t, first.shared[0]); !apiequality.Semantic.DeepEqual(&copied.Items[0], shared) {
				t.Errorf("a plain list starts with %v, a shared one with %v", &copied.Items[0], shared)
			}
		})
	}
}
