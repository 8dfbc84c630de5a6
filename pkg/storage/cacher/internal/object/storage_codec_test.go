package object

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplefuzzer "k8s.io/apiserver/pkg/apis/example/fuzzer"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
)

// TestStorageCodec checks which stored bytes the storage codec decodes
// itself, and that every answer, error included, is the storage's codec's.
func TestStorageCodec(t *testing.T) {
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	sc := NewStorageCodec(json, scheme, func() runtime.Object { return &example.Pod{} }).(*storageCodec)
	pod := edgePod()
	canonical := encodedPod(t, json, pod, "") // As etcd3 stores it.
	tests := []struct {
		name    string
		data    []byte
		fast    bool
		wantErr bool
	}{
		{name: "what the codec stores", data: canonical, fast: true},
		{name: "keys in another order", data: bytes.Replace(canonical, []byte(`"name":"edge","namespace":"ns"`), []byte(`"namespace":"ns","name":"edge"`), 1)},
		{name: "an unknown field", data: bytes.Replace(canonical, []byte(`"name":"edge"`), []byte(`"name":"edge","x":1`), 1)},
		{name: "a key in another case", data: bytes.Replace(canonical, []byte(`"nodeName"`), []byte(`"NodeName"`), 1)},
		{name: "a key twice", data: bytes.Replace(canonical, []byte(`"name":"edge"`), []byte(`"name":"other","name":"edge"`), 1)},
		{name: "indented", data: bytes.Replace(canonical, []byte(`,"apiVersion"`), []byte(", \"apiVersion\""), 1)},
		// encoding/json reads it as U+FFFD; the exact decoder refuses it.
		{name: "invalid UTF-8", data: bytes.Replace(canonical, []byte(`"name":"edge"`), []byte("\"name\":\"ed\xffge\""), 1)},
		{name: "protobuf", data: encodedPod(t, examplev1Blob, pod, "")},
		{name: "truncated", data: canonical[:len(canonical)-3], wantErr: true},
		{name: "not an object", data: []byte(`[]`), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, ok := sc.decodeFast(tc.data, nil, &example.Pod{}); ok != tc.fast {
				t.Errorf("decoded fast: %v, want %v", ok, tc.fast)
			}
			got, _, err := sc.Decode(tc.data, nil, &example.Pod{})
			want, _, wantErr := examplev1Blob.Decode(tc.data, nil, &example.Pod{})
			if tc.name != "protobuf" {
				want, _, wantErr = json.Decode(tc.data, nil, &example.Pod{})
			}
			if (err != nil) != tc.wantErr || (err == nil) != (wantErr == nil) {
				t.Fatalf("error %v, the codec's %v; want an error: %v", err, wantErr, tc.wantErr)
			}
			if err == nil && !apiequality.Semantic.DeepEqual(got, want) {
				t.Errorf("decoded\n%#v\nthe codec decodes\n%#v", got, want)
			}
			// With no object to decode into, as etcd3's watch decodes
			// every event: the same answers, as fast.
			if _, _, ok := sc.decodeFast(tc.data, nil, nil); ok != tc.fast {
				t.Errorf("decoded fast with no object given: %v, want %v", ok, tc.fast)
			}
			got, err = runtime.Decode(sc, tc.data)
			if (err != nil) != tc.wantErr {
				t.Fatalf("with no object given: error %v, want an error: %v", err, tc.wantErr)
			}
			if err == nil && !apiequality.Semantic.DeepEqual(got, want) {
				t.Errorf("with no object given, decoded\n%#v\nthe codec decodes\n%#v", got, want)
			}
		})
	}
}

// TestStorageCodecMatches checks, over fuzzed pods stored as etcd3 stores
// them, that the storage codec decodes what the storage's codec does, and
// that it decodes them itself.
func TestStorageCodecMatches(t *testing.T) {
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	sc := NewStorageCodec(json, scheme, func() runtime.Object { return &example.Pod{} }).(*storageCodec)
	f := fuzzer.FuzzerFor(fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, examplefuzzer.Funcs), rand.NewSource(28), codecs)
	fast := 0
	const n = 500
	for i := range n {
		pod := &example.Pod{}
		f.Fill(pod)
		pod.ResourceVersion = ""
		var buf bytes.Buffer
		if err := json.Encode(pod, &buf); err != nil {
			t.Fatal(err)
		}
		// What a write stores is what a read of it decodes to.
		obj, _, err := json.Decode(buf.Bytes(), nil, &example.Pod{})
		if err != nil {
			t.Fatal(err)
		}
		buf.Reset()
		if err := json.Encode(obj, &buf); err != nil {
			t.Fatal(err)
		}
		if _, _, ok := sc.decodeFast(buf.Bytes(), nil, &example.Pod{}); ok {
			fast++
		}
		got, _, err := sc.Decode(buf.Bytes(), nil, &example.Pod{})
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		if !apiequality.Semantic.DeepEqual(got, obj) {
			t.Fatalf("pod %d: decoded\n%#v\nthe codec decodes\n%#v\nfrom %s", i, got, obj, buf.Bytes())
		}
	}
	if fast != n {
		t.Errorf("%d of %d stored pods decoded fast, want all", fast, n)
	}
}

// BenchmarkStorageDecode compares, in one run, what a stored 1 KiB pod
// costs to decode with the storage's codec, which etcd3 uses, and with the
// storage codec, which checks its result with an encode.
//
//	go test ./pkg/storage/cacher/internal/object -run '^$' -bench StorageDecode -count 5
func BenchmarkStorageDecode(b *testing.B) {
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	stored := encodedPod(b, json, benchPod(1024), "")
	for _, c := range []struct {
		name  string
		codec runtime.Codec
	}{{"codec", json}, {"storage-codec", NewStorageCodec(json, scheme, func() runtime.Object { return &example.Pod{} })}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := c.codec.Decode(stored, nil, &example.Pod{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		// As etcd3's watch decodes every event: into no object.
		b.Run(c.name+"-watch", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := runtime.Decode(c.codec, stored); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchPod is bench-scale's object as a pod: a label, a 1 KiB annotation,
// one managedFields entry.
func benchPod(payload int) *example.Pod {
	now := metav1.Now()
	return &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a-000001", Namespace: "ns-1", UID: "6d0f1c2e-1b7a-4c1e-9a55-000000000001",
		ResourceVersion: "12345", CreationTimestamp: now, Labels: map[string]string{"group": "g1"},
		Annotations: map[string]string{"payload": strings.Repeat("0", payload)},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "bench.test", Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "example.apiserver.k8s.io/v1", Time: &now, FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{".":{},"f:payload":{}},"f:labels":{".":{},"f:group":{}}},"f:spec":{".":{},"f:nodeName":{}}}`)}}}},
		Spec: example.PodSpec{NodeName: "agent-1"}}
}
