package object

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"unsafe"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
)

// newPodIngest returns a Builder for pods under /pods/ with the trigger
// field spec.nodeName and a JSON codec, made from scheme.
func newPodIngest() *Builder {
	return newIngest(codecs.LegacyCodec(examplev1.SchemeGroupVersion), scheme)
}

// newIngest is newPodIngest's with codec, and s as its Scheme.
func newIngest(codec runtime.Codec, s *runtime.Scheme) *Builder {
	return NewBuilder(BuilderConfig{
		Codec:        codec,
		Scheme:       s,
		KeyFunc:      func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc("/pods/", obj) },
		NewFunc:      func() runtime.Object { return &example.Pod{} },
		GetAttrsFunc: podAttrs,
		TriggerField: "spec.nodeName",
		IndexerFuncs: storage.IndexerFuncs{"spec.nodeName": func(obj runtime.Object) string { return obj.(*example.Pod).Spec.NodeName }},
		Versioner:    storage.APIObjectVersioner{},
	})
}

// podIngest is the Builder every test's hand-made pods are ingested by.
var podIngest = newPodIngest()

// podObject returns pod as ingest keeps it, at /pods/<namespace>/<name>.
// It panics if ingest fails, which the test's pod decides.
func podObject(pod *example.Pod) *Object {
	o, err := podIngest.Build(pod)
	if err != nil {
		panic(err)
	}
	return o
}

// TestObjectCodecLearnsEncoders: an encoder that writes an object's bytes
// is learnt as one, and its later answers are the bytes; any other
// encoder, even one whose output differs from the bytes in a single field,
// is not, and the object is encoded for it. (That the bytes themselves are
// right, TestResponsesFromBytes in test/integration shows against a server
// without the cache.)
func TestObjectCodecLearnsEncoders(t *testing.T) {
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "7", Labels: map[string]string{"a": "<b>"}},
		Spec: example.PodSpec{NodeName: "n\u2028"}}
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	yaml := codecs.EncoderForVersion(yamlSerializer(t), examplev1.SchemeGroupVersion)
	for _, tc := range []struct {
		name    string
		id      runtime.Identifier
		encode  func(runtime.Object, io.Writer) error
		wantRaw bool
	}{
		{name: "the storage codec", id: "json", encode: json.Encode, wantRaw: true},
		{name: "YAML", id: "yaml", encode: yaml.Encode},
		{name: "JSON but for the resourceVersion", id: "json-rv", encode: func(obj runtime.Object, w io.Writer) error {
			p := obj.DeepCopyObject().(*example.Pod)
			p.ResourceVersion = "6"
			return json.Encode(p, w)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newPodIngest()
			o, err := c.Build(pod)
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			if err := tc.encode(pod, &want); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				var got bytes.Buffer
				if err := NewCaching(o).CacheEncode(tc.id, tc.encode, &got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got.Bytes(), want.Bytes()) {
					t.Fatalf("encoding %d: %s, want %s", i, got.Bytes(), want.Bytes())
				}
			}
			if got := c.Codec().kind(tc.id) == encoderRaw; got != tc.wantRaw {
				t.Errorf("learnt as writing the bytes: %v, want %v", got, tc.wantRaw)
			}
			if tc.wantRaw {
				// Learnt, the bytes are the answer: the encoder is not asked.
				var got bytes.Buffer
				fail := func(runtime.Object, io.Writer) error { return fmt.Errorf("encoded") }
				if err := NewCaching(o).CacheEncode(tc.id, fail, &got); err != nil || !bytes.Equal(got.Bytes(), o.Raw) {
					t.Errorf("after learning: %q, %v; want the bytes", got.Bytes(), err)
				}
			}
		})
	}
}

func yamlSerializer(t *testing.T) runtime.Serializer {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeYAML)
	if !ok {
		t.Fatal("no YAML serializer")
	}
	return info.Serializer
}

// TestTypeHeader: the header of an object's bytes is the kind and
// apiVersion JSON writes first, and only that.
func TestTypeHeader(t *testing.T) {
	for raw, want := range map[string]int{
		`{"kind":"Pod","apiVersion":"v1","metadata":{}}`: len(`{"kind":"Pod","apiVersion":"v1",`),
		`{"kind":"Pod","apiVersion":"v1"}`:               0,
		`{"apiVersion":"v1","kind":"Pod","metadata":{}}`: 0,
		`{"kind":"P\"od","apiVersion":"v1","a":1}`:       0,
		`{"metadata":{}}`: 0,
		"\n\x0a\x02v1":    0,
	} {
		if got := TypeHeader([]byte(raw)); int(got) != want {
			t.Errorf("typeHeader(%q) = %d, want %d", raw, got, want)
		}
	}
}

// TestDecodeWithScheme: with BuilderConfig.Scheme the cache decodes its bytes as
// the storage's codec does, for JSON with a type header, and leaves other
// bytes (protobuf here) to the codec.
func TestDecodeWithScheme(t *testing.T) {
	owned := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "owned", Namespace: "ns", ResourceVersion: "7",
		// Keys named like the header's after it, as in every owner reference.
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u"}},
		Labels:          map[string]string{"a": "<b>&\u2028\"kind\":\"Node\""}, Annotations: map[string]string{"ü": "\u2029"}},
		Spec: example.PodSpec{NodeName: "n1", Hostname: "é"}}
	plain := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "ns", ResourceVersion: "3"}}
	for _, tc := range []struct {
		name  string
		codec runtime.Codec
	}{
		{"json", codecs.LegacyCodec(examplev1.SchemeGroupVersion)},
		{"protobuf", examplev1Blob},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withScheme, codecOnly := newIngest(tc.codec, scheme), newIngest(tc.codec, nil)
			if withScheme.codec.decoder == nil || codecOnly.codec.decoder != nil {
				t.Fatalf("decoder made: %v with the scheme, %v without", withScheme.codec.decoder != nil, codecOnly.codec.decoder != nil)
			}
			for _, pod := range []*example.Pod{owned, plain} {
				o, err := withScheme.Build(pod)
				if err != nil {
					t.Fatal(err)
				}
				if json := tc.name == "json"; (o.Head > 0) != json {
					t.Fatalf("%s: header %d; want one: %v", pod.Name, o.Head, json)
				}
				fast, err := o.Decode()
				if err != nil {
					t.Fatal(err)
				}
				slow, _, err := tc.codec.Decode(o.Raw, nil, &example.Pod{})
				if err != nil {
					t.Fatal(err)
				}
				if !apiequality.Semantic.DeepEqual(fast, slow) || !apiequality.Semantic.DeepEqual(fast, pod) {
					t.Errorf("%s: decoded with the scheme\n%#v\nwith the codec\n%#v\ningested\n%#v", pod.Name, fast, slow, pod)
				}
			}
		})
	}
}

// TestStoredSize: an object's StoredSize is the length of what etcd3
// stores for it, the storage codec's bytes without a resourceVersion.
func TestStoredSize(t *testing.T) {
	codec := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	for _, tc := range []struct {
		name string
		pod  example.Pod
		rv   string
	}{
		{name: "name only", pod: example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, rv: "7"},
		{name: "long resourceVersion", pod: example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}, rv: "18446744073709551615"},
		{name: "ten digits", pod: example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", UID: "u",
			Labels: map[string]string{"k": "v"}}, Spec: example.PodSpec{NodeName: "n"}}, rv: "1000000000"},
		{name: "no resourceVersion", pod: example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored, err := runtime.Encode(codec, &tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			pod := tc.pod.DeepCopy()
			pod.ResourceVersion = tc.rv
			if got := podObject(pod).StoredSize(); got != int64(len(stored)) {
				t.Errorf("StoredSize = %d, want %d, the length of %s", got, len(stored), stored)
			}
		})
	}
}

// TestName checks that an object's name is kept as an offset into its key
// when the key ends in it, and apart otherwise, without changing attrs
// other objects share.
func TestName(t *testing.T) {
	shared := &attrs{fields: []string{"metadata.namespace", "ns"}}
	for _, tc := range []struct {
		key, name string
		inKey     bool
	}{
		{"/registry/pods/ns/a", "a", true},
		{"a", "a", true},
		{"/registry/pods/ns/xa", "a", false},
		{"/registry/pods/ns/a", "b", false},
		{"/registry/pods/ns/", "", true},
		{"/registry/pods/ns/a", "", false},
		{"/" + strings.Repeat("k", math.MaxUint16) + "/a", "a", false},
	} {
		o := &Object{Key: tc.key, attrs: shared}
		o.SetName(tc.name)
		if got := o.Name(); got != tc.name {
			t.Errorf("key %.30q: Name() = %q, want %q", tc.key, got, tc.name)
		}
		if inKey := o.attrs == shared; inKey != tc.inKey {
			t.Errorf("key %.30q, name %q: kept in the key %v, want %v", tc.key, tc.name, inKey, tc.inKey)
		}
		if !slices.Equal(o.Fields(), shared.fields) || shared.name != "" {
			t.Errorf("key %.30q, name %q: fields %q, shared name %q", tc.key, tc.name, o.Fields(), shared.name)
		}
	}
}

// TestRecordSize holds an object's record to Go's 128-byte size class: it
// is kept for every version the cache holds (docs/architecture.md).
func TestRecordSize(t *testing.T) {
	if size := unsafe.Sizeof(Object{}); size > 128 {
		t.Errorf("an Object takes %d bytes, more than 128", size)
	}
}

// TestPack checks that an object's key and trigger value, laid after its
// bytes, read back as given, whether or not the bytes had room for them,
// and that the bytes end where the strings begin: an append to them must
// not write into the key.
func TestPack(t *testing.T) {
	for _, tc := range []struct {
		name         string
		raw          []byte
		key, trigger string
	}{
		{"room for both", append(make([]byte, 0, 64), `{"a":1}`...), "/registry/pods/ns/a", "node-1"},
		{"no trigger", append(make([]byte, 0, 64), `{"a":1}`...), "/registry/pods/ns/a", ""},
		{"no room", []byte(`{"a":1}`), "/registry/pods/ns/a", "node-1"},
		{"room for the key only", append(make([]byte, 0, 7+19), `{"a":1}`...), "/registry/pods/ns/a", "node-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := string(tc.raw)
			key, trigger := tc.key, tc.trigger
			raw := pack(tc.raw, &key, &trigger)
			if string(raw) != want || key != tc.key || trigger != tc.trigger {
				t.Fatalf("pack = %q, %q, %q; want %q, %q, %q", raw, key, trigger, want, tc.key, tc.trigger)
			}
			if cap(raw) != len(raw) {
				t.Errorf("the bytes' capacity is %d, past their length %d, over the strings", cap(raw), len(raw))
			}
			_ = append(raw, strings.Repeat("x", 64)...)
			if key != tc.key || trigger != tc.trigger {
				t.Errorf("after an append to the bytes: %q, %q", key, trigger)
			}
		})
	}
}

// TestWatchEventsLearntAsFrames: a watch encoder whose events are the
// same frame around the object's bytes is learnt as one, after which its
// events are written without asking it; an encoder whose events differ
// (pretty JSON), or whose embedded encoder does not write the bytes, is
// not. The encoders are built as the watch handler's are: a WatchEvent,
// holding what the embedded encoder wrote, encoded by the outer one.
// (TestResponsesFromBytes in test/integration compares whole watches with
// a server without the cache.)
func TestWatchEventsLearntAsFrames(t *testing.T) {
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "7", Labels: map[string]string{"a": "<b>&"}},
		Spec: example.PodSpec{NodeName: "n\u2028"}}
	json := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	// Not the bytes: JSON but for the resourceVersion.
	otherRV := runtime.WithVersionEncoder{Version: examplev1.SchemeGroupVersion, Encoder: encoderFunc(func(obj runtime.Object, w io.Writer) error {
		p := obj.DeepCopyObject().(*example.Pod)
		p.ResourceVersion = "6"
		return json.Encode(p, w)
	}), ObjectTyper: scheme}
	// The bytes for a pod without labels only.
	noLabels := runtime.WithVersionEncoder{Version: examplev1.SchemeGroupVersion, Encoder: encoderFunc(func(obj runtime.Object, w io.Writer) error {
		p := obj.DeepCopyObject().(*example.Pod)
		p.Labels = nil
		return json.Encode(p, w)
	}), ObjectTyper: scheme}
	unlabelled := pod.DeepCopy()
	unlabelled.Labels = nil
	compact := jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme, scheme, jsonserializer.SerializerOptions{})
	pretty := jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme, scheme, jsonserializer.SerializerOptions{Pretty: true})
	for _, tc := range []struct {
		name              string
		embedded, outer   runtime.Encoder
		embeddedID, outID string
		// pod is what the events carry, pod above if nil; learnt, if set,
		// is what the embedded encoder is first asked for.
		pod, learnt *example.Pod
		wantFrame   bool
	}{
		{name: "JSON", embedded: json, embeddedID: "json", outer: compact, outID: "compact", wantFrame: true},
		{name: "pretty JSON", embedded: json, embeddedID: "json", outer: pretty, outID: "pretty"},
		{name: "not the bytes inside", embedded: otherRV, embeddedID: "other-rv", outer: compact, outID: "compact"},
		// Its events for this pod are the frame, but the embedded encoder
		// was seen not to write the bytes of every pod.
		{name: "not the bytes of every pod inside", embedded: noLabels, embeddedID: "no-labels", outer: compact, outID: "compact",
			pod: unlabelled, learnt: pod},
	} {
		for _, eventType := range []string{"ADDED", "DELETED"} {
			t.Run(tc.name+"/"+eventType, func(t *testing.T) {
				id := runtime.Identifier(fmt.Sprintf(`{"name":"watch","embeddedEncoder":%q,"encoder":%q,"eventType":%q}`, tc.embeddedID, tc.outID, eventType))
				encode := func(obj runtime.Object, w io.Writer) error {
					var inner bytes.Buffer
					if err := obj.(runtime.CacheableObject).CacheEncode(runtime.Identifier(tc.embeddedID), tc.embedded.Encode, &inner); err != nil {
						return err
					}
					return tc.outer.Encode(&metav1.WatchEvent{Type: eventType, Object: runtime.RawExtension{Raw: inner.Bytes()}}, w)
				}
				c := newPodIngest()
				if tc.learnt != nil {
					o, err := c.Build(tc.learnt)
					if err != nil {
						t.Fatal(err)
					}
					if err := NewCaching(o).CacheEncode(runtime.Identifier(tc.embeddedID), tc.embedded.Encode, io.Discard); err != nil {
						t.Fatal(err)
					}
				}
				o, err := c.Build(cmp.Or(tc.pod, pod))
				if err != nil {
					t.Fatal(err)
				}
				var want bytes.Buffer
				if err := encode(NewCaching(o), &want); err != nil {
					t.Fatal(err)
				}
				for i := range 2 {
					var got bytes.Buffer
					if err := NewCaching(o).CacheEncode(id, encode, &got); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got.Bytes(), want.Bytes()) {
						t.Fatalf("event %d: %s, want %s", i, got.Bytes(), want.Bytes())
					}
				}
				if _, got := c.Codec().eventStart(id); got != tc.wantFrame {
					t.Fatalf("learnt as a frame: %v, want %v", got, tc.wantFrame)
				}
				if tc.wantFrame {
					var got bytes.Buffer
					fail := func(runtime.Object, io.Writer) error { return fmt.Errorf("encoded") }
					if err := NewCaching(o).CacheEncode(id, fail, &got); err != nil || !bytes.Equal(got.Bytes(), want.Bytes()) {
						t.Errorf("after learning: %q, %v; want %q", got.Bytes(), err, want.Bytes())
					}
				}
			})
		}
	}
}

// TestMadeObjectsLearntAsTheirBytes checks that an object the cache made,
// such as a bookmark, teaches a watch encoder what its bytes teach: a
// bookmark's empty object, decoded with the defaults a decoder sets, no
// longer encoded as its bytes, and when it was the first object a watch
// encoder met, every event after it was encoded again, for each stream.
func TestMadeObjectsLearntAsTheirBytes(t *testing.T) {
	// Pods whose decoder defaults their restart policy.
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(s))
	utilruntime.Must(examplev1.AddToScheme(s))
	s.AddTypeDefaultingFunc(&examplev1.Pod{}, func(obj any) {
		if p := obj.(*examplev1.Pod); p.Spec.RestartPolicy == "" {
			p.Spec.RestartPolicy = "Always"
		}
	})
	json := serializer.NewCodecFactory(s).LegacyCodec(examplev1.SchemeGroupVersion)
	c := newIngest(json, s)
	bookmark := &example.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "5"}}
	raw, err := c.Codec().Encode(bookmark)
	if err != nil {
		t.Fatal(err)
	}
	made := NewCachingOf(&Object{Raw: raw, Head: TypeHeader(raw), Codec: c.Codec(), RV: 5}, bookmark)
	const id = runtime.Identifier("json")
	var got bytes.Buffer
	if err := made.CacheEncode(id, json.Encode, &got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), raw) {
		t.Fatalf("the bookmark encoded as %s, want its bytes %s", got.Bytes(), raw)
	}
	if k := c.Codec().kind(id); k != encoderRaw {
		t.Fatalf("after the bookmark the encoder is %v, want encoderRaw", k)
	}
	// A pod from etcd, which its decoder defaulted, is still sent as its bytes.
	o, err := c.Build(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "6"},
		Spec: example.PodSpec{RestartPolicy: "Always"}})
	if err != nil {
		t.Fatal(err)
	}
	fail := func(runtime.Object, io.Writer) error { return fmt.Errorf("encoded, not sent as its bytes") }
	got.Reset()
	if err := NewCaching(o).CacheEncode(id, fail, &got); err != nil || !bytes.Equal(got.Bytes(), o.Raw) {
		t.Fatalf("the pod after the bookmark: %q, %v; want its bytes %q", got.Bytes(), err, o.Raw)
	}
}

// encoderFunc is a runtime.Encoder that encodes with itself.
type encoderFunc func(runtime.Object, io.Writer) error

func (f encoderFunc) Encode(obj runtime.Object, w io.Writer) error { return f(obj, w) }
func (encoderFunc) Identifier() runtime.Identifier                 { return "func" }
