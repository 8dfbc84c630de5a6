package object

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
)

// sharedKind keeps its kind behind a pointer, which a copy of its struct
// shares.
type sharedKind struct {
	kind *metav1.TypeMeta
}

func (s *sharedKind) GetObjectKind() schema.ObjectKind { return s.kind }
func (s *sharedKind) DeepCopyObject() runtime.Object {
	k := *s.kind
	return &sharedKind{kind: &k}
}

// TestEncodable checks that an encoder is given an object whose kind it
// may set without changing the cached one, and that typed objects get a
// copy of their top-level struct only.
func TestEncodable(t *testing.T) {
	gvk := schema.GroupVersionKind{Group: "g", Version: "v1", Kind: "K"}
	for _, tc := range []struct {
		name string
		obj  runtime.Object
		// shallow is whether the copy shares what lies below its struct.
		shallow bool
	}{
		{name: "typed: its struct copied", obj: &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p",
			Labels: map[string]string{"a": "b"}}}, shallow: true},
		{name: "unstructured: a deep copy", obj: &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": "p"}}}},
		{name: "kind behind a pointer: a deep copy", obj: &sharedKind{kind: &metav1.TypeMeta{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.obj.GetObjectKind().GroupVersionKind()
			cp := encodable(tc.obj)
			if cp == tc.obj {
				t.Fatal("the encoder is given the cached object")
			}
			cp.GetObjectKind().SetGroupVersionKind(gvk)
			if got := tc.obj.GetObjectKind().GroupVersionKind(); got != before {
				t.Errorf("setting the copy's kind changed the cached object's to %v", got)
			}
			if !tc.shallow {
				return
			}
			if reflect.ValueOf(cp.(*example.Pod).Labels).UnsafePointer() != reflect.ValueOf(tc.obj.(*example.Pod).Labels).UnsafePointer() {
				t.Error("the typed copy does not share the labels: a deep copy")
			}
		})
	}
}

// TestCacheEncodeConcurrent encodes one object in several encodings at
// once with the versioning codec, which sets the kind of what it encodes
// and puts it back, while others read the cached object: with -race it
// fails if an encoder is handed the shared object.
func TestCacheEncodeConcurrent(t *testing.T) {
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"a": "b"}}}
	co := NewCaching(podObject(pod))
	codec := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	const n = 8
	out := make([]bytes.Buffer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := runtime.Identifier(fmt.Sprintf("json-%d", i%4)) // two senders an encoding
			if err := co.CacheEncode(id, codec.Encode, &out[i]); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() { _ = co.GetObjectKind().GroupVersionKind() })
	}
	wg.Wait()
	for i := range out {
		if s := out[i].String(); !strings.Contains(s, `"apiVersion":"example.apiserver.k8s.io/v1"`) ||
			!strings.Contains(s, `"labels":{"a":"b"}`) {
			t.Errorf("encoding %d: %s", i, s)
		}
	}
	obj, _ := co.object()
	if gvk := obj.GetObjectKind().GroupVersionKind(); !gvk.Empty() {
		t.Errorf("the shared decoded object's kind is %v after encoding", gvk)
	}
}
