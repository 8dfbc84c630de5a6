package apiserver

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// servedJSON returns the group's JSON serializer info as the server serves it.
func servedJSON(t testing.TB) runtime.SerializerInfo {
	for _, info := range newAPIGroupInfo().NegotiatedSerializer.SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeJSON {
			return info
		}
	}
	t.Fatal("no JSON serializer")
	return runtime.SerializerInfo{}
}

// countingSerializer counts the watch events that reach the serializer.
type countingSerializer struct {
	runtime.Serializer
	events int
}

func (s *countingSerializer) Encode(obj runtime.Object, w io.Writer) error {
	if _, ok := obj.(*metav1.WatchEvent); ok {
		s.events++
	}
	return s.Serializer.Encode(obj, w)
}

// TestWatchEventEncoderMatchesJSON encodes watch events as the watch
// handler does, the object with the group's JSON serializer and the event
// around it with its stream serializer, and requires the served encoder's
// bytes to be the JSON serializer's own. It also requires the frame to be
// written directly for objects the JSON serializer wrote, and left to the
// serializer for anything compacting would change.
func TestWatchEventEncoderMatchesJSON(t *testing.T) {
	info := servedJSON(t)
	served, ok := info.StreamSerializer.Serializer.(watchEventEncoder)
	if !ok {
		t.Fatalf("the served JSON stream serializer is a %T, not a watchEventEncoder", info.StreamSerializer.Serializer)
	}
	ns := newAPIGroupInfo().NegotiatedSerializer
	gv := v1beta1.SchemeGroupVersion
	embedded := ns.EncoderForVersion(info.Serializer, gv)
	encodeObject := func(obj runtime.Object) []byte {
		var b bytes.Buffer
		if err := embedded.Encode(obj, &b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	tricky := "<a href=\"x?y=1&z=2\">\t\n\\\" \u2028\u2029 € ü 日本 \x7f</a>"
	assignment := &v1beta1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", ResourceVersion: "7",
			Labels: map[string]string{"k": "v w"}, Annotations: map[string]string{"tricky": tricky, "quote\"key": `\\`}},
		Spec: v1beta1.AssignmentSpec{AgentName: "agent one"},
	}
	indented, err := json.MarshalIndent(map[string]string{"a": "b"}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var unescaped bytes.Buffer
	enc := json.NewEncoder(&unescaped)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(map[string]string{"a": "<&>"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		typ    string
		raw    []byte
		object runtime.Object
		direct bool
	}{
		{name: "added", typ: string(watch.Added), raw: encodeObject(assignment), direct: true},
		{name: "modified", typ: string(watch.Modified), raw: encodeObject(assignment), direct: true},
		{name: "deleted", typ: string(watch.Deleted), raw: encodeObject(assignment), direct: true},
		{name: "bookmark", typ: string(watch.Bookmark), raw: encodeObject(&v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{
			ResourceVersion: "9", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}), direct: true},
		{name: "error", typ: string(watch.Error), raw: encodeObject(&metav1.Status{Status: metav1.StatusFailure,
			Message: "too old resource version: 1 (5)", Reason: metav1.StatusReasonExpired, Code: 410}), direct: true},
		{name: "other event type", typ: "SOME<&>TYPE\u2028", raw: encodeObject(assignment), direct: true},
		{name: "quote escaped before a space", typ: "ADDED", raw: []byte(`{"a":"x\" y","b":"\\"}` + "\n"), direct: true},
		{name: "indented", typ: "ADDED", raw: append(indented, '\n')},
		{name: "space outside strings", typ: "ADDED", raw: []byte(`{"a": "b"}` + "\n")},
		{name: "not escaped for HTML", typ: "ADDED", raw: unescaped.Bytes()},
		{name: "raw U+2028", typ: "ADDED", raw: []byte("{\"a\":\"\u2028\"}\n")},
		{name: "no newline after", typ: "ADDED", raw: bytes.TrimSuffix(encodeObject(assignment), []byte("\n"))},
		{name: "not an object", typ: "ADDED", raw: []byte("[1,2]\n")},
		{name: "no raw", typ: "ADDED", object: assignment},
		{name: "nothing", typ: "ADDED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			event := func() *metav1.WatchEvent {
				return &metav1.WatchEvent{Type: tc.typ, Object: runtime.RawExtension{Raw: bytes.Clone(tc.raw), Object: tc.object}}
			}
			var want bytes.Buffer
			if err := ns.EncoderForVersion(served.Serializer, gv).Encode(event(), &want); err != nil {
				t.Fatal(err)
			}
			counting := &countingSerializer{Serializer: served.Serializer}
			var got bytes.Buffer
			if err := ns.EncoderForVersion(watchEventEncoder{counting}, gv).Encode(event(), &got); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("encoded\n%s\nwant\n%s", got.String(), want.String())
			}
			if direct := counting.events == 0; direct != tc.direct {
				t.Errorf("frame written directly: %v, want %v", direct, tc.direct)
			}
		})
	}
}

// BenchmarkWatchEventEncode encodes a watch event of a 1 KiB object as
// the watch handler does for each object it sends first, the object then
// the event around it: with the JSON serializer alone, and with the
// served encoder.
func BenchmarkWatchEventEncode(b *testing.B) {
	info := servedJSON(b)
	ns := newAPIGroupInfo().NegotiatedSerializer
	gv := v1beta1.SchemeGroupVersion
	obj := &v1beta1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: "a-1234", Namespace: "ns", ResourceVersion: "7",
			Labels: map[string]string{"group": "g3"}, Annotations: map[string]string{"payload": strings.Repeat("x", 1024)}},
		Spec: v1beta1.AssignmentSpec{AgentName: "agent-7"},
	}
	embedded := ns.EncoderForVersion(info.Serializer, gv)
	for _, enc := range []struct {
		name string
		s    runtime.Serializer
	}{
		{"json", info.StreamSerializer.Serializer.(watchEventEncoder).Serializer},
		{"served", info.StreamSerializer.Serializer},
	} {
		b.Run(enc.name, func(b *testing.B) {
			e := ns.EncoderForVersion(enc.s, gv)
			var raw, out bytes.Buffer
			b.ReportAllocs()
			for b.Loop() {
				raw.Reset()
				out.Reset()
				if err := embedded.Encode(obj, &raw); err != nil {
					b.Fatal(err)
				}
				if err := e.Encode(&metav1.WatchEvent{Type: "ADDED", Object: runtime.RawExtension{Raw: raw.Bytes()}}, &out); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(out.Len()))
		})
	}
}
