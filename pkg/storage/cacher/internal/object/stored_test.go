package object

import (
	"bytes"
	"fmt"
	"math/rand"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplefuzzer "k8s.io/apiserver/pkg/apis/example/fuzzer"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
)

// encodedPod returns what the codec writes for pod at resourceVersion rv:
// with "", what etcd3 stores.
func encodedPod(t testing.TB, codec runtime.Codec, pod *example.Pod, rv string) []byte {
	t.Helper()
	p := pod.DeepCopy()
	p.ResourceVersion = rv
	var buf bytes.Buffer
	if err := codec.Encode(p, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestSpliceRV checks that spliceRV writes the resourceVersion where the
// JSON serializer does, whichever of the metadata's keys before it an
// object has, and that it declines what it cannot splice.
func TestSpliceRV(t *testing.T) {
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	meta := func(m metav1.ObjectMeta) *example.Pod { return &example.Pod{ObjectMeta: m} }
	tests := []struct {
		name string
		pod  *example.Pod
	}{
		{name: "empty metadata", pod: meta(metav1.ObjectMeta{})},
		{name: "only a name", pod: meta(metav1.ObjectMeta{Name: "a"})},
		{name: "only a later key", pod: meta(metav1.ObjectMeta{Generation: 3})},
		{name: "a generated name", pod: meta(metav1.ObjectMeta{GenerateName: "a-"})},
		{name: "namespace, no name", pod: meta(metav1.ObjectMeta{Namespace: "ns"})},
		{name: "every key before it", pod: meta(metav1.ObjectMeta{Name: "a", GenerateName: "a-", Namespace: "ns",
			SelfLink: "/x", UID: "u"})},
		{name: "every key before it and after", pod: meta(metav1.ObjectMeta{Name: "a", Namespace: "ns", UID: "u",
			Generation: 1, Labels: map[string]string{"resourceVersion": "x"}})},
		{name: "the edge pod", pod: edgePod()},
		{name: "a uid only", pod: meta(metav1.ObjectMeta{UID: "u"})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := encodedPod(t, json, tc.pod, "12345")
			got, ok := spliceRV(encodedPod(t, json, tc.pod, ""), "12345", 0)
			if !ok || !bytes.Equal(got, want) {
				t.Errorf("spliced (%v)\n%s\nthe codec writes\n%s", ok, got, want)
			}
		})
	}
	stored, withRV := encodedPod(t, json, edgePod(), ""), encodedPod(t, json, edgePod(), "5")
	escaped := encodedPod(t, json, meta(metav1.ObjectMeta{Name: "a<b"}), "")
	declined := []struct {
		name   string
		stored []byte
		rv     string
	}{
		{name: "a resourceVersion already", stored: withRV, rv: "6"},
		{name: "no resourceVersion given", stored: stored, rv: ""},
		{name: "a resourceVersion that is not a number", stored: stored, rv: `1"`},
		{name: "an escape in a key's value before it", stored: escaped, rv: "5"},
		{name: "no type header", stored: []byte(`{"metadata":{"name":"a"},"kind":"Pod","apiVersion":"v1"}`), rv: "5"},
		{name: "metadata after another field", stored: []byte(`{"kind":"Pod","apiVersion":"v1","spec":{},"metadata":{}}`), rv: "5"},
		{name: "protobuf", stored: encodedPod(t, examplev1Blob, edgePod(), ""), rv: "5"},
		{name: "nothing", rv: "5"},
	}
	for _, tc := range declined {
		t.Run(tc.name, func(t *testing.T) {
			if got, ok := spliceRV(tc.stored, tc.rv, 0); ok {
				t.Errorf("spliced\n%s\nwant it declined", got)
			}
		})
	}
}

// TestBuildStored checks, over fuzzed pods decoded as the etcd3 store
// decodes a StoredList's items, that Build writes the bytes the codec
// encodes for the decoded pod: the same Object as from the pod itself.
func TestBuildStored(t *testing.T) {
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	sc := NewStorageCodec(json, scheme, func() runtime.Object { return &example.Pod{} })
	f := fuzzer.FuzzerFor(fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, examplefuzzer.Funcs), rand.NewSource(27), codecs)
	b := newPodIngest()
	spliced := 0
	const n = 300
	for i := range n {
		pod := &example.Pod{}
		f.Fill(pod)
		// Fuzzed names make no key.
		pod.Name, pod.Namespace = fmt.Sprintf("p-%d", i), "ns"
		if i == 0 {
			pod = edgePod()
		}
		want := encodedPod(t, json, pod, "777")
		item, err := decodeStoredItem(sc, encodedPod(t, json, pod, ""), 777)
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		if item.Stored != nil {
			spliced++
		}
		got, err := b.Build(item)
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		if !bytes.Equal(got.Raw, want) {
			t.Fatalf("pod %d: built\n%s\nthe codec writes\n%s", i, got.Raw, want)
		}
		if key, _ := b.Key(item); key != got.Key {
			t.Errorf("pod %d: key %q, built %q", i, key, got.Key)
		}
	}
	if b.splice.Load() != spliceRight || spliced < n*9/10 {
		t.Errorf("%d of %d pods kept their stored bytes, splice state %d; want most, and %d", spliced, n, b.splice.Load(), spliceRight)
	}
}

// decodeStoredItem decodes stored as the etcd3 store decodes a
// StoredList's item at revision rev.
func decodeStoredItem(codec runtime.Codec, stored []byte, rev uint64) (*StoredItem, error) {
	item := &StoredItem{}
	if _, _, err := codec.Decode(stored, nil, item); err != nil {
		return nil, err
	}
	return item, storage.APIObjectVersioner{}.UpdateObject(item, rev)
}

// TestBuildStoredChecksFirst checks that the first splice is checked
// against the encoder: stored bytes a splice makes wrong (here, another
// version's) are caught, the object is encoded, and so is every later one.
func TestBuildStoredChecksFirst(t *testing.T) {
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	b := newPodIngest()
	pod := edgePod()
	pod.ResourceVersion = "9"
	stale := edgePod()
	stale.Spec.NodeName = "stale"
	stored, want := encodedPod(t, json, stale, ""), encodedPod(t, json, pod, "9")
	for i := range 2 {
		got, err := b.Build(&StoredItem{Obj: pod.DeepCopy(), Stored: stored})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Raw, want) {
			t.Fatalf("build %d: built\n%s\nwant\n%s", i, got.Raw, want)
		}
	}
	if b.splice.Load() != spliceWrong {
		t.Errorf("splice state %d, want %d", b.splice.Load(), spliceWrong)
	}
	// A StoredItem without bytes is encoded, and teaches nothing.
	fresh := newPodIngest()
	if _, err := fresh.Build(&StoredItem{Obj: pod.DeepCopy()}); err != nil || fresh.splice.Load() != spliceUnknown {
		t.Errorf("built with no stored bytes: %v, splice state %d", err, fresh.splice.Load())
	}
}

// TestStoredListDecode checks what the storage codec decodes into a
// StoredItem: bytes it decodes itself are kept, bytes the storage's codec
// decodes are not, and errors are the codec's.
func TestStoredListDecode(t *testing.T) {
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	sc := NewStorageCodec(json, scheme, func() runtime.Object { return &example.Pod{} })
	canonical, proto := encodedPod(t, json, edgePod(), ""), encodedPod(t, examplev1Blob, edgePod(), "")
	for _, tc := range []struct {
		name      string
		data      []byte
		keep, err bool
	}{
		{name: "what the codec stores", data: canonical, keep: true},
		{name: "keys in another order", data: bytes.Replace(canonical, []byte(`"name":"edge","namespace":"ns"`), []byte(`"namespace":"ns","name":"edge"`), 1)},
		{name: "protobuf", data: proto},
		{name: "truncated", data: canonical[:len(canonical)-3], err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			item, err := decodeStoredItem(sc, tc.data, 3)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want one: %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if (item.Stored != nil) != tc.keep {
				t.Errorf("kept the stored bytes: %v, want %v", item.Stored != nil, tc.keep)
			}
			pod, ok := item.Obj.(*example.Pod)
			if !ok || pod.Name != "edge" || pod.ResourceVersion != "3" {
				t.Errorf("decoded %#v, want the edge pod at resourceVersion 3", item.Obj)
			}
		})
	}
	// A codec with no NewFunc cannot make the item's object.
	if _, err := decodeStoredItem(NewStorageCodec(json, scheme, nil), canonical, 3); err == nil {
		t.Error("decoded a stored item with no NewFunc")
	}
}

// BenchmarkBuildStored compares, in one run, what a stored 1 KiB pod costs
// to decode as the etcd3 store decodes a list's item and then build: with
// its bytes encoded from the object, and spliced from the bytes it was
// decoded from.
//
//	go test ./pkg/storage/cacher/internal/object -run '^$' -bench BuildStored -count 5
func BenchmarkBuildStored(b *testing.B) {
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	sc := NewStorageCodec(json, scheme, func() runtime.Object { return &example.Pod{} })
	stored := encodedPod(b, json, benchPod(1024), "")
	for _, keep := range []bool{false, true} {
		name := map[bool]string{false: "encoded", true: "spliced"}[keep]
		b.Run(name, func(b *testing.B) {
			builder := newPodIngest()
			b.ReportAllocs()
			for b.Loop() {
				item, err := decodeStoredItem(sc, stored, 123456)
				if err != nil {
					b.Fatal(err)
				}
				if !keep {
					item.Stored = nil
				}
				if _, err := builder.Build(item); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
