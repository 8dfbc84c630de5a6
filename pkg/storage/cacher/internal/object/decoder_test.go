package object

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	fast := newJSONDecoder(scheme, false)
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
			t.Fatalf("pod %d: the exact decoder did not decode %s", i, o.Raw)
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

// TestDecoderFallsBack checks what the exact decoder leaves to the serializer:
// unstructured objects, bytes with no type header, and bytes it cannot
// parse. The serializer's answer, error included, is the decoder's.
func TestDecoderFallsBack(t *testing.T) {
	d := newJSONDecoder(scheme, false)
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
				t.Errorf("decoded fast: %v, want %v", ok, tc.fast)
			}
			_, _, err := d.Decode(tc.data, nil, tc.into)
			_, _, want := d.serializer.Decode(tc.data, nil, tc.into)
			if (err != nil) != tc.wantErr || (err == nil) != (want == nil) {
				t.Errorf("error %v, the serializer's %v; want an error: %v", err, want, tc.wantErr)
			}
		})
	}
}

// TestExactTypes checks which types decodeExact decodes itself: none that
// holds an interface{} encoding/json would fill, or that it cannot decode
// as encoding/json does.
func TestExactTypes(t *testing.T) {
	type tree struct {
		Children []*tree `json:"children"`
		Name     string  `json:"name"`
	}
	type Inner struct{ A string }
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
		{name: "an array", v: struct{ A [2]int }{}, want: false},
		{name: "a map with int keys", v: struct{ M map[int]string }{}, want: false},
		{name: "a string option", v: struct {
			N int `json:",string"`
		}{}, want: false},
		{name: "two fields of one name", v: struct {
			Inner
			A string
		}{}, want: false},
		{name: "an embedded pointer", v: struct{ *Inner }{}, want: false},
		{name: "json.Number", v: struct{ N json.Number }{}, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := exactTypes.of(reflect.TypeOf(tc.v)); (err == nil) != tc.want {
				t.Errorf("got %v, want it decoded: %v", err, tc.want)
			}
		})
	}
}

// TestDecodedStringsShareTheBytes: a decode of the cache's own bytes
// shares their strings, which never change, and copies their field sets,
// which are []byte a caller may change; the storage codec, whose input is
// etcd's and not the cache's, copies everything. A string shares the bytes
// if it changes when they are written over after the decode.
func TestDecodedStringsShareTheBytes(t *testing.T) {
	codec := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	stored, err := runtime.Encode(codec, benchPod(64))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		d      runtime.Decoder
		shares bool
	}{
		{name: "the cache's decoder", d: newIngest(codec, scheme).Codec().decoder, shares: true},
		{name: "the storage codec", d: NewStorageCodec(codec, scheme, func() runtime.Object { return &example.Pod{} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := bytes.Clone(stored)
			got, _, err := tc.d.Decode(in, nil, &example.Pod{})
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := tc.d.Decode(bytes.Clone(stored), nil, &example.Pod{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range in {
				in[i] = 'x'
			}
			g, w := got.(*example.Pod), want.(*example.Pod)
			for what, pair := range map[string][2]string{"name": {g.Name, w.Name}, "an annotation": {g.Annotations["payload"], w.Annotations["payload"]},
				"a label value": {g.Labels["group"], w.Labels["group"]}, "a manager": {g.ManagedFields[0].Manager, w.ManagedFields[0].Manager}} {
				if shared := pair[0] != pair[1]; shared != tc.shares {
					t.Errorf("%s shares the bytes decoded: %v, want %v", what, shared, tc.shares)
				}
			}
			if !bytes.Equal(g.ManagedFields[0].FieldsV1.Raw, w.ManagedFields[0].FieldsV1.Raw) {
				t.Error("a field set shares the bytes decoded; its holder may change them")
			}
		})
	}
}

// TestHeaderMetaRemembersOneHeader checks that the header it remembers
// answers only for that header, and that what it returns is the caller's
// own: the serializer writes defaults into it.
func TestHeaderMetaRemembersOneHeader(t *testing.T) {
	m := &headerMeta{}
	pod := []byte(`{"kind":"Pod","apiVersion":"example.apiserver.k8s.io/v1","metadata":{}}`)
	tests := []struct {
		data []byte
		want schema.GroupVersionKind
	}{
		{pod, schema.GroupVersionKind{Group: "example.apiserver.k8s.io", Version: "v1", Kind: "Pod"}},
		{pod, schema.GroupVersionKind{Group: "example.apiserver.k8s.io", Version: "v1", Kind: "Pod"}},
		{pod, schema.GroupVersionKind{Group: "example.apiserver.k8s.io", Version: "v1", Kind: "Pod"}},
		{[]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{}}`), schema.GroupVersionKind{Version: "v1", Kind: "Pod"}},
		{[]byte(`{"kind":"Node","apiVersion":"v1","metadata":{}}`), schema.GroupVersionKind{Version: "v1", Kind: "Node"}},
		{pod, schema.GroupVersionKind{Group: "example.apiserver.k8s.io", Version: "v1", Kind: "Pod"}},
	}
	for i, tc := range tests {
		got, err := m.Interpret(tc.data)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if *got != tc.want {
			t.Errorf("%d: %v, want %v", i, *got, tc.want)
		}
		got.Kind = "Changed by the caller"
	}
}
