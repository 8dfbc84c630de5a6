package cacher

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// podIngest builds every test's hand-made pods as the cache would: under
// /pods/, with the trigger field spec.nodeName and a JSON codec.
var podIngest = object.NewBuilder(object.BuilderConfig{
	Codec:        codecs.LegacyCodec(examplev1.SchemeGroupVersion),
	Scheme:       scheme,
	KeyFunc:      func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc("/pods/", obj) },
	NewFunc:      func() runtime.Object { return &example.Pod{} },
	GetAttrsFunc: podAttrs,
	TriggerField: "spec.nodeName",
	IndexerFuncs: storage.IndexerFuncs{"spec.nodeName": func(obj runtime.Object) string { return obj.(*example.Pod).Spec.NodeName }},
	Versioner:    storage.APIObjectVersioner{},
})

// podObject returns pod as the cache keeps it, at /pods/<namespace>/<name>.
// It panics if that fails, which the test's pod decides.
func podObject(pod *example.Pod) *object.Object {
	o, err := podIngest.Build(pod)
	if err != nil {
		panic(err)
	}
	return o
}

// decodedPod returns o's pod: o is a cached object, its Caching or a pod.
func decodedPod(t testing.TB, o runtime.Object) *example.Pod {
	t.Helper()
	if co, ok := o.(*object.Caching); ok {
		o = co.GetObject()
	} else if obj, ok := o.(*object.Object); ok {
		o = obj.DeepCopyObject()
	}
	pod, ok := o.(*example.Pod)
	if !ok {
		t.Fatalf("not a pod: %T", o)
	}
	return pod
}

// objectName returns the name of an object a watcher received: a cached
// object's without decoding it, as a benchmark's consumer must not.
func objectName(obj runtime.Object) string {
	if co, ok := obj.(*object.Caching); ok {
		return co.Cached().Name
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetName()
}

// metaOf returns what meta.Accessor finds of obj, failing the test if nothing.
func metaOf(t testing.TB, obj runtime.Object) metav1.Object {
	t.Helper()
	m, err := meta.Accessor(obj)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
