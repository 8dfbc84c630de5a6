package registry

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/metrics"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/install"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// mediaTypes are the group's: NewDefaultAPIGroupInfo's codecs, with the
// streaming collection encoders, less protobuf, which the fleet types do
// not implement (see pkg/apiserver).
func mediaTypes(t testing.TB) (serializer.CodecFactory, []runtime.SerializerInfo) {
	t.Helper()
	scheme := runtime.NewScheme()
	install.Install(scheme)
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	cf := serializer.NewCodecFactory(scheme, serializer.WithStreamingCollectionEncodingToJSON())
	var infos []runtime.SerializerInfo
	for _, info := range cf.SupportedMediaTypes() {
		if info.MediaType != runtime.ContentTypeProtobuf {
			infos = append(infos, info)
		}
	}
	return cf, infos
}

// assignments returns n assignments, each with what an encoder may write
// differently: labels, annotations, a timestamp, a status.
func assignments(n, payload int) []fleet.Assignment {
	out := make([]fleet.Assignment, n)
	for i := range out {
		out[i] = fleet.Assignment{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("a-%d", i), Namespace: "ns", ResourceVersion: fmt.Sprint(10 + i),
				Labels: map[string]string{"group": fmt.Sprint(i % 3)}, Annotations: map[string]string{"payload": strings.Repeat("x", payload)},
				CreationTimestamp: metav1.Unix(int64(1_700_000_000+i), 0)},
			Spec:   fleet.AssignmentSpec{AgentName: fmt.Sprintf("agent-%d", i%7), Payload: `say "hi"`, Priority: int32(i % 5)},
			Status: fleet.AssignmentStatus{Phase: fleet.AssignmentRunning, ObservedGeneration: int64(i)},
		}
	}
	return out
}

// share returns a sharedList of pointers to items, as the cache hands them.
func share(items []fleet.Assignment, m metav1.ListMeta) *sharedList {
	objs := make([]runtime.Object, len(items))
	for i := range items {
		objs[i] = &items[i]
	}
	return &sharedList{ListMeta: m, Items: objs, newList: func() runtime.Object { return &fleet.AssignmentList{} }}
}

// TestSharedListEncoding: a shared list encodes, in every media type and
// printing the group serves, to the very bytes of the same list copied into
// the resource's list type, around the chunk boundaries too, and leaves
// the shared objects as they were.
func TestSharedListEncoding(t *testing.T) {
	cf, infos := mediaTypes(t)
	lm := metav1.ListMeta{ResourceVersion: "42", Continue: "dG9rZW4", RemainingItemCount: ptr.To[int64](7)}
	for _, n := range []int{0, 1, sharedListChunk - 1, sharedListChunk, sharedListChunk + 1, 3*sharedListChunk + 5} {
		items := assignments(n, 16)
		before := assignments(n, 16)
		for _, info := range infos {
			encoders := map[string]runtime.Serializer{"": info.Serializer}
			if info.PrettySerializer != nil {
				encoders[" pretty"] = info.PrettySerializer
			}
			for name, s := range encoders {
				t.Run(fmt.Sprintf("%d items %s%s", n, info.MediaType, name), func(t *testing.T) {
					enc := cf.EncoderForVersion(s, v1beta1.SchemeGroupVersion)
					typed := &fleet.AssignmentList{ListMeta: *lm.DeepCopy(), Items: append([]fleet.Assignment{}, items...)}
					if n == 0 {
						typed.Items = []fleet.Assignment{} // as storage answers, and the handler sets
					}
					var want, got bytes.Buffer
					if err := enc.Encode(typed, &want); err != nil {
						t.Fatal(err)
					}
					if err := enc.Encode(share(items, *lm.DeepCopy()), &got); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got.Bytes(), want.Bytes()) {
						t.Errorf("shared list encodes to\n%.600s\nwant\n%.600s", got.Bytes(), want.Bytes())
					}
					if !apiequality.Semantic.DeepEqual(items, before) {
						t.Error("encoding changed the shared objects")
					}
				})
			}
		}
	}
}

// TestSharedListResponse writes a large shared list through the
// apiserver's response writer for a client that accepts gzip: the response
// is compressed, as the list type's is, and is the same JSON. A first
// write longer than 4 bytes would make the writer send it uncompressed:
// 5 to 10 times the bytes, each encrypted.
func TestSharedListResponse(t *testing.T) {
	cf, infos := mediaTypes(t)
	info, _ := runtime.SerializerInfoForMediaType(infos, runtime.ContentTypeJSON)
	enc := cf.EncoderForVersion(info.Serializer, v1beta1.SchemeGroupVersion)
	items := assignments(1000, 1024)
	respond := func(obj runtime.Object) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/apis/fleet.example.com/v1beta1/assignments", nil)
		req.Header.Set("Accept-Encoding", "gzip")
		w := httptest.NewRecorder()
		responsewriters.SerializeObject(runtime.ContentTypeJSON, enc, w, req, http.StatusOK, obj)
		return w
	}
	want := respond(&fleet.AssignmentList{Items: append([]fleet.Assignment(nil), items...)})
	got := respond(share(items, metav1.ListMeta{}))
	if g, w := got.Header().Get("Content-Encoding"), want.Header().Get("Content-Encoding"); g != "gzip" || w != "gzip" {
		t.Fatalf("Content-Encoding %q for the shared list, %q for the list type; want gzip", g, w)
	}
	unzip := func(r *httptest.ResponseRecorder) []byte {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !bytes.Equal(unzip(got), unzip(want)) {
		t.Error("the shared list's response differs from the list type's")
	}
}

// heapProbe discards what is written to it and, once half of want bytes
// are written, measures the live heap.
type heapProbe struct {
	want, total int
	live        uint64
}

func (w *heapProbe) Write(p []byte) (int, error) {
	w.total += len(p)
	if w.live == 0 && w.total >= w.want/2 {
		w.live = liveHeap()
	}
	return len(p), nil
}

func liveHeap() uint64 {
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestSharedListHoldsNoCopy measures the live heap halfway through writing
// a list of 20,000 shared objects: it holds less than a quarter of what
// copies of them would weigh. A list copied whole before it is written, as
// upstream's cache copies it, holds them all and fails; so does a response
// built whole before it is written.
func TestSharedListHoldsNoCopy(t *testing.T) {
	const n = 20_000
	cf, infos := mediaTypes(t)
	info, _ := runtime.SerializerInfoForMediaType(infos, runtime.ContentTypeJSON)
	enc := cf.EncoderForVersion(info.Serializer, v1beta1.SchemeGroupVersion)
	cached := assignments(n, 16)
	l := share(cached, metav1.ListMeta{})
	var size bytes.Buffer
	if err := enc.Encode(l, &size); err != nil {
		t.Fatal(err)
	}
	w := &heapProbe{want: size.Len()}
	before := liveHeap()
	if err := enc.Encode(l, w); err != nil {
		t.Fatal(err)
	}
	// The cache keeps its objects: copies do not replace them.
	goruntime.KeepAlive(cached)
	copies := uint64(n) * uint64(unsafe.Sizeof(fleet.Assignment{}))
	if w.live == 0 {
		t.Fatal("never measured")
	}
	if grown := int64(w.live) - int64(before); grown > int64(copies/4) {
		t.Errorf("halfway through the list the live heap grew by %d bytes; copies of its %d objects weigh %d", grown, n, copies)
	}
}

// TestSharedListConcurrentEncoding encodes lists that share their objects
// at once, in the media types that copy a chunk and that copy the whole
// list: under -race it fails if encoding writes to a shared object, as an
// encoder converting each shared object in place would (it sets and
// restores the object's kind).
func TestSharedListConcurrentEncoding(t *testing.T) {
	cf, infos := mediaTypes(t)
	items := assignments(2*sharedListChunk+1, 16)
	var wg sync.WaitGroup
	for i := range 8 {
		info := infos[i%len(infos)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf bytes.Buffer
			if err := cf.EncoderForVersion(info.Serializer, v1beta1.SchemeGroupVersion).Encode(share(items, metav1.ListMeta{}), &buf); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// TestSharedListGetObject: the copy is the resource's list type, equal to
// the shared list, and changing it leaves the shared objects alone.
func TestSharedListGetObject(t *testing.T) {
	items := assignments(3, 4)
	l := share(items, metav1.ListMeta{ResourceVersion: "9"})
	got, ok := l.GetObject().(*fleet.AssignmentList)
	if !ok {
		t.Fatalf("GetObject returned %T", l.GetObject())
	}
	if got.ResourceVersion != "9" || !apiequality.Semantic.DeepEqual(got.Items, items) {
		t.Fatalf("GetObject returned %+v", got)
	}
	got.Items[0].Name = "changed"
	if items[0].Name != "a-0" {
		t.Error("changing the copy changed a shared object")
	}
}

// TestSharedListItems: meta's list helpers, which Table and
// PartialObjectMetadataList responses use, see the shared objects
// themselves, and the list's metadata.
func TestSharedListItems(t *testing.T) {
	items := assignments(3, 4)
	l := share(items, metav1.ListMeta{ResourceVersion: "9", Continue: "c"})
	if !meta.IsListType(l) || meta.LenList(l) != 3 {
		t.Fatalf("IsListType %v, LenList %d", meta.IsListType(l), meta.LenList(l))
	}
	i := 0
	if err := meta.EachListItem(l, func(o runtime.Object) error {
		if o != &items[i] {
			t.Errorf("item %d is not the shared object", i)
		}
		i++
		return nil
	}); err != nil || i != 3 {
		t.Fatalf("EachListItem visited %d items: %v", i, err)
	}
	var li metav1.ListInterface = l
	if li.GetResourceVersion() != "9" || li.GetContinue() != "c" {
		t.Errorf("list metadata %+v", l.ListMeta)
	}
}

// bytesItem is an item that gives its bytes to a list, as the cache's
// objects do (listItem), for every encoder.
type bytesItem struct {
	*fleet.Assignment
	open, rest []byte
}

func (b bytesItem) ListItem(runtime.Identifier, func(runtime.Object, io.Writer) error) (open []byte, n int, ok bool) {
	return b.open, len(b.rest), true
}

func (b bytesItem) AppendItem(dst []byte) ([]byte, error) { return append(dst, b.rest...), nil }

// itemStream is a GzipItemStream of one member that counts its items.
type itemStream struct {
	*gzip.Writer
	items int
}

func (s *itemStream) WriteItem(prefix []byte, item runtime.Object) error {
	s.items++
	if _, err := s.Write(prefix); err != nil {
		return err
	}
	frame, err := item.(listItem).AppendItem(nil)
	if err != nil {
		return err
	}
	_, err = s.Write(frame)
	return err
}

// TestSharedListGzip: a shared list whose items all give their bytes, and
// whose request carries a GzipResponse, writes its response itself through
// the response's GzipItemStream when the library would compress it: larger
// than 128 KiB. The response is what the library writes for the list
// type, compressed; any other list is the library's to write.
func TestSharedListGzip(t *testing.T) {
	cf, infos := mediaTypes(t)
	info, _ := runtime.SerializerInfoForMediaType(infos, runtime.ContentTypeJSON)
	enc := cf.EncoderForVersion(info.Serializer, v1beta1.SchemeGroupVersion)
	withBytes := func(items []fleet.Assignment) *sharedList {
		l := share(items, metav1.ListMeta{ResourceVersion: "42"})
		for i := range items {
			var buf bytes.Buffer
			if err := enc.Encode(&fleet.AssignmentList{Items: items[i : i+1]}, &buf); err != nil {
				t.Fatal(err)
			}
			_, item, _ := bytes.Cut(buf.Bytes(), itemsKey)
			item, _ = bytes.CutSuffix(item, listEnd)
			l.Items[i] = bytesItem{Assignment: &items[i], open: item[:1], rest: item[1:]}
		}
		return l
	}
	for _, tc := range []struct {
		name string
		list *sharedList
		// gzip is whether the request carries a GzipResponse; ours whether
		// the list writes through it, and compressed whether the response is.
		gzip, ours, compressed bool
	}{
		{name: "large, of bytes", list: withBytes(assignments(300, 1024)), gzip: true, ours: true, compressed: true},
		{name: "small, of bytes", list: withBytes(assignments(30, 1024)), gzip: true},
		{name: "large, of objects", list: share(assignments(300, 1024), metav1.ListMeta{ResourceVersion: "42"}), gzip: true, compressed: true},
		{name: "large, of bytes, not asked for", list: withBytes(assignments(300, 1024)), compressed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stream *itemStream
			req := httptest.NewRequest(http.MethodGet, "/apis/fleet.example.com/v1beta1/assignments", nil)
			req.Header.Set("Accept-Encoding", "gzip")
			w := httptest.NewRecorder()
			// What the library's request metrics see: the route's writer.
			route := &metrics.ResponseWriterDelegator{ResponseWriter: w}
			l := *tc.list
			if tc.gzip {
				l.gzip = &GzipResponse{Header: w.Header(), NewStream: func(w io.Writer) GzipItemStream {
					stream = &itemStream{Writer: gzip.NewWriter(w)}
					return stream
				}}
			}
			responsewriters.SerializeObject(runtime.ContentTypeJSON, enc, route, req, http.StatusOK, &l)
			if (stream != nil) != tc.ours || stream != nil && stream.items != len(l.Items) {
				t.Fatalf("the list's own stream: %v, want %v", stream, tc.ours)
			}
			if route.Status() != http.StatusOK || route.ContentLength() != w.Body.Len() {
				t.Fatalf("the route's writer saw %d and %d bytes, want 200 and the %d sent", route.Status(), route.ContentLength(), w.Body.Len())
			}
			if got := w.Header().Get("Content-Encoding") == "gzip"; got != tc.compressed || w.Code != http.StatusOK ||
				w.Header().Get("Content-Type") != runtime.ContentTypeJSON {
				t.Fatalf("%d, Content-Type %q, Content-Encoding %q", w.Code, w.Header().Get("Content-Type"), w.Header().Get("Content-Encoding"))
			}
			body := w.Body.Bytes()
			if tc.compressed {
				zr, err := gzip.NewReader(w.Body)
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			var want bytes.Buffer
			if err := enc.Encode(l.GetObject(), &want); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(body, want.Bytes()) {
				t.Errorf("the response is\n%.300s\nwant\n%.300s", body, want.Bytes())
			}
		})
	}
}
