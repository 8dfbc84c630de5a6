// Package objecttest is the cache's tests' fixtures: upstream's example
// pods, their scheme and selectable fields, and the pods as the cache keeps
// them. The object package's own tests keep theirs, since they cannot
// import this package.
package objecttest

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/sharding"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

var (
	// Scheme and Codecs are the example pods', internal and v1.
	Scheme = runtime.NewScheme()
	Codecs = serializer.NewCodecFactory(Scheme)
	// ExampleV1Blob stores pods as v1 protobuf, as etcd3's tests do.
	ExampleV1Blob runtime.Codec
)

func init() {
	metav1.AddToGroupVersion(Scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(Scheme))
	utilruntime.Must(examplev1.AddToScheme(Scheme))
	pb := protobuf.NewSerializer(Scheme, Scheme)
	ExampleV1Blob = Codecs.CodecForVersions(pb, pb, schema.GroupVersions{examplev1.SchemeGroupVersion}, nil)
}

// PodAttrs returns a pod's labels and selectable fields.
func PodAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	pod, ok := obj.(*example.Pod)
	if !ok {
		return nil, nil, fmt.Errorf("not a pod: %T", obj)
	}
	return pod.Labels, fields.Set{
		"metadata.name":      pod.Name,
		"metadata.namespace": pod.Namespace,
		"spec.nodeName":      pod.Spec.NodeName,
		"spec.restartPolicy": string(pod.Spec.RestartPolicy),
		"status.phase":       string(pod.Status.Phase),
	}, nil
}

// Pods builds every test's hand-made pods as the cache would: under
// /pods/, with the trigger field spec.nodeName and a JSON codec.
var Pods = object.NewBuilder(object.BuilderConfig{
	Codec:        Codecs.LegacyCodec(examplev1.SchemeGroupVersion),
	Scheme:       Scheme,
	KeyFunc:      func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc("/pods/", obj) },
	NewFunc:      func() runtime.Object { return &example.Pod{} },
	GetAttrsFunc: PodAttrs,
	TriggerField: "spec.nodeName",
	IndexerFuncs: storage.IndexerFuncs{"spec.nodeName": func(obj runtime.Object) string { return obj.(*example.Pod).Spec.NodeName }},
	Versioner:    storage.APIObjectVersioner{},
})

// PodObject returns pod as the cache keeps it, at /pods/<namespace>/<name>.
// It panics if that fails, which the test's pod decides.
func PodObject(pod *example.Pod) *object.Object {
	o, err := Pods.Build(pod)
	if err != nil {
		panic(err)
	}
	return o
}

// DecodedPod returns o's pod: o is a cached object, its Caching or a pod.
func DecodedPod(tb testing.TB, o runtime.Object) *example.Pod {
	tb.Helper()
	if co, ok := o.(*object.Caching); ok {
		o = co.GetObject()
	} else if obj, ok := o.(*object.Object); ok {
		o = obj.DeepCopyObject()
	}
	pod, ok := o.(*example.Pod)
	if !ok {
		tb.Fatalf("not a pod: %T", o)
	}
	return pod
}

// ObjectName returns the name of an object a watcher received: a cached
// object's without decoding it, as a benchmark's consumer must not.
func ObjectName(obj runtime.Object) string {
	if co, ok := obj.(*object.Caching); ok {
		return co.Cached().Name()
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetName()
}

// MetaOf returns what meta.Accessor finds of obj, failing the test if nothing.
func MetaOf(tb testing.TB, obj runtime.Object) metav1.Object {
	tb.Helper()
	m, err := meta.Accessor(obj)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// Got is what a test read of an event: its type, and its object's name and
// resourceVersion; an ERROR event has only its type.
type Got struct {
	Type watch.EventType
	Name string
	RV   string
}

// Receive reads n events from w, failing the test if w closes first or
// they do not come within wait.ForeverTestTimeout.
func Receive(tb testing.TB, w watch.Interface, n int) []Got {
	tb.Helper()
	var out []Got
	timeout := time.After(wait.ForeverTestTimeout)
	for len(out) < n {
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				tb.Fatalf("watch closed after %v", out)
			}
			if e.Type == watch.Error {
				out = append(out, Got{Type: e.Type})
				continue
			}
			m := MetaOf(tb, e.Object)
			out = append(out, Got{e.Type, m.GetName(), m.GetResourceVersion()})
		case <-timeout:
			tb.Fatalf("only %d of %d events: %v", len(out), n, out)
		}
	}
	return out
}

// ShardSelector builds a selector of ranges on path, as the API's parser would.
func ShardSelector(path string, bounds ...[2]string) sharding.Selector {
	var reqs []sharding.ShardRangeRequirement
	for _, b := range bounds {
		reqs = append(reqs, sharding.ShardRangeRequirement{Key: path, Start: b[0], End: b[1]})
	}
	return sharding.NewSelector(reqs...)
}
