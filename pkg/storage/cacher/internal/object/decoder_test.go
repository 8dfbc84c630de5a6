package object

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apiserver/pkg/apis/example"
	examplefuzzer "k8s.io/apiserver/pkg/apis/example/fuzzer"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
)

// TestDecoderMatchesStorage checks, over fuzzed pods and hand-made edge
// cases, that jsonDecoder decodes the cache's bytes to what the storage's
// codec does, and that it does so itself rather than through the
// serializer it falls back to.
func TestDecoderMatchesStorage(t *testing.T) {
	codec := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	b := newIngest(codec, scheme)
	fast := &jsonDecoder{api: sharing, scheme: scheme, safe: map[reflect.Type]bool{}}
	f := fuzzer.FuzzerFor(fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, examplefuzzer.Funcs), rand.NewSource(27), codecs)
	pods := []*example.Pod{edgePod()}
	for range 500 {
		pod := &example.Pod{}
		f.Fill(pod)
		// The key is made of them, so they must be valid.
		pod.Name, pod.Namespace, pod.ResourceVersion = fmt.Sprintf("p%d", len(pods)), "ns", "9"
		pods = append(pods, pod)
	}
	for i, pod := range pods {
		o, err := b.Build(pod)
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		if _, _, ok := fast.decodeFast(o.Raw, nil); !ok {
			t.Fatalf("pod %d: jsoniter did not decode %s", i, o.Raw)
		}
		got, err := o.Decode()
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		want, _, err := codec.Decode(o.Raw, nil, &example.Pod{})
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		if !apiequality.Semantic.DeepEqual(got, want) {
			t.Fatalf("pod %d: decoded\n%#v\nthe storage's codec decodes\n%#v\nfrom %s", i, got, want, o.Raw)
		}
	}
}

// edgePod holds what JSON encoders escape or spell differently: HTML
// characters, line and paragraph separators, non-ASCII, control
// characters, empty maps and nil slices, a deletion timestamp.
func edgePod() *example.Pod {
	now := metav1.Unix(1700000000, 0)
	return &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "ns", ResourceVersion: "5",
		Labels: map[string]string{}, Annotations: map[string]string{"a": "<b>&\u2028\u2029é\x01\t\"\\ 🚀"},
		DeletionTimestamp: &now, Finalizers: nil},
		Spec: example.PodSpec{NodeName: "n\u00e9", NodeSelector: map[string]string{}}}
}

// TestDecoderFallsBack checks what jsoniter leaves to the serializer:
// unstructured objects, bytes with no type header, and bytes it cannot
// parse. The serializer's answer, error included, is the decoder's.
func TestDecoderFallsBack(t *testing.T) {
	s := jsonserializer.NewSerializerWithOptions(headerMeta{}, scheme, scheme, jsonserializer.SerializerOptions{})
	d := &jsonDecoder{api: sharing, scheme: scheme, serializer: s, safe: map[reflect.Type]bool{}}
	pod := []byte(`{"kind":"Pod","apiVersion":"example.apiserver.k8s.io/v1","metadata":{"name":"p"}}`)
	tests := []struct {
		name    string
		data    []byte
		into    runtime.Object
		fast    bool
		wantErr bool
	}{
		{name: "the cache's bytes", data: pod, fast: true},
		{name: "unstructured", data: pod, into: &unstructured.Unstructured{}},
		{name: "no type header", data: []byte(`{"metadata":{"name":"p"},"kind":"Pod","apiVersion":"example.apiserver.k8s.io/v1"}`), wantErr: true},
		{name: "truncated", data: pod[:len(pod)-2], wantErr: true},
		{name: "an unknown kind", data: []byte(`{"kind":"Nope","apiVersion":"example.apiserver.k8s.io/v1","metadata":{}}`), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, ok := d.decodeFast(tc.data, tc.into); ok != tc.fast {
				t.Errorf("decoded by jsoniter: %v, want %v", ok, tc.fast)
			}
			_, _, err := d.Decode(tc.data, nil, tc.into)
			_, _, want := s.Decode(tc.data, nil, tc.into)
			if (err != nil) != tc.wantErr || (err == nil) != (want == nil) {
				t.Errorf("error %v, the serializer's %v; want an error: %v", err, want, tc.wantErr)
			}
		})
	}
}

// TestNoInterface checks which types jsoniter may decode: none that holds
// an interface{} encoding/json would fill.
func TestNoInterface(t *testing.T) {
	type tree struct {
		Children []*tree `json:"children"`
		Name     string  `json:"name"`
	}
	tests := []struct {
		name string
		v    any
		want bool
	}{
		{name: "a pod", v: example.Pod{}, want: true},
		{name: "a recursive type", v: tree{}, want: true},
		{name: "an interface field", v: struct{ X any }{}, want: false},
		{name: "an interface in a map", v: struct{ M map[string]any }{}, want: false},
		{name: "an interface in a slice of pointers", v: struct{ S []*struct{ X any } }{}, want: false},
		{name: "an interface not decoded", v: struct {
			X any `json:"-"`
			y any
		}{}, want: true},
		{name: "an interface behind UnmarshalJSON", v: struct{ R runtime.RawExtension }{}, want: true},
		{name: "a type that decodes itself", v: struct{ J json.RawMessage }{}, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := noInterface(reflect.TypeOf(tc.v), map[reflect.Type]bool{}); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDecodedStringsShareTheBytes checks that a decode of the cache's own
// bytes shares their strings, which never change, and copies their field
// sets, which are []byte a caller may change; and that the storage codec,
// whose input is etcd's and not the cache's, copies both.
func TestDecodedStringsShareTheBytes(t *testing.T) {
	codec := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	o, err := newIngest(codec, scheme).Build(benchPod(64))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := runtime.Encode(codec, benchPod(64))
	if err != nil {
		t.Fatal(err)
	}
	fromStorage, _, err := NewStorageCodec(codec, scheme, func() runtime.Object { return &example.Pod{} }).Decode(stored, nil, &example.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	fromCache, err := o.Decode()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		pod        *example.Pod
		in         []byte
		wantShared bool
	}{
		{name: "the cache's bytes", pod: fromCache.(*example.Pod), in: o.Raw, wantShared: true},
		{name: "etcd's bytes", pod: fromStorage.(*example.Pod), in: stored},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for what, s := range map[string]string{"name": tc.pod.Name, "an annotation": tc.pod.Annotations["payload"],
				"a label": tc.pod.Labels["group"], "a manager": tc.pod.ManagedFields[0].Manager} {
				if got := within(unsafe.StringData(s), tc.in); got != tc.wantShared {
					t.Errorf("%s shares the bytes decoded: %v, want %v", what, got, tc.wantShared)
				}
			}
			if within(unsafe.SliceData(tc.pod.ManagedFields[0].FieldsV1.Raw), tc.in) {
				t.Error("a field set shares the bytes decoded; its holder may change them")
			}
		})
	}
}
