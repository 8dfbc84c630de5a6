package object

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
)

// lastWrite keeps the slice it was last given, not a copy: the watch
// handler's writers hand the cache's bytes on as they are.
type lastWrite struct{ p []byte }

func (w *lastWrite) Write(p []byte) (int, error) { w.p = p; return len(p), nil }

// watchAdded is the watch handler's identifier for a JSON ADDED event.
const watchAdded = runtime.Identifier(`{"name":"watch","embeddedEncoder":"json","encoder":"json","eventType":"ADDED"}`)

// framed returns the watch event frames that n Cachings hold, as the watch
// handler writes them, of pods at resourceVersion rv.
func framed(t *testing.T, n int, rv string) ([]*Caching, [][]byte) {
	t.Helper()
	codec := codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	encode := func(obj runtime.Object, w io.Writer) error {
		if _, err := io.WriteString(w, `{"type":"ADDED","object":`); err != nil {
			return err
		}
		if err := codec.Encode(obj.(*Caching).GetObject(), w); err != nil {
			return err
		}
		_, err := io.WriteString(w, "}\n")
		return err
	}
	cos := make([]*Caching, n)
	out := make([][]byte, n)
	for i := range n {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: "ns", ResourceVersion: rv},
			Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i%10)}}
		cos[i] = NewCaching(podObject(pod))
		var w lastWrite
		if err := cos[i].CacheEncode(watchAdded, encode, &w); err != nil {
			t.Fatal(err)
		}
		out[i] = w.p
	}
	return cos, out
}

// streamed is what a GzipStream wrote.
type streamed struct {
	body []byte
	// sent is what was written to the stream; flushed, the lengths of body
	// and sent at each flush.
	sent    []byte
	flushed [][2]int
}

// stream writes each of writes (a []byte, or nil for a flush) to a new
// GzipStream, and closes it.
func stream(t *testing.T, writes [][]byte) streamed {
	t.Helper()
	var out streamed
	var body bytes.Buffer
	s := NewGzipStream(&body)
	for _, p := range writes {
		if p == nil {
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			out.flushed = append(out.flushed, [2]int{body.Len(), len(out.sent)})
			continue
		}
		if n, err := s.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write: %d, %v", n, err)
		}
		out.sent = append(out.sent, p...)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	out.body = body.Bytes()
	return out
}

// TestGzipStream: streams that send the same frames of the cache's in the
// same order share the segments of their runs, compressed by the first;
// whatever is written, each stream decompresses to exactly it, and a
// client reads everything written before a flush without waiting for more.
func TestGzipStream(t *testing.T) {
	const n = 3000 // runs begin at 1 in 64 frames: none would be 2e-21
	cos, frames := framed(t, n, "7")
	newer, newerFrames := framed(t, n, "8")
	// A frame is known while its encoding lives.
	defer goruntime.KeepAlive(cos)
	defer goruntime.KeepAlive(newer)
	bookmark := []byte(`{"type":"BOOKMARK","object":{}}` + "\n")
	withFlushes := func(frames [][]byte, every int) [][]byte {
		var w [][]byte
		for i, f := range frames {
			w = append(w, f)
			if (i+1)%every == 0 {
				w = append(w, nil)
			}
		}
		return append(w, bookmark, nil)
	}
	// Some objects at a newer version, none where a run begins: the
	// runs the stream holds back are as long as the first stream's.
	var someNewer [][]byte
	for i, f := range frames {
		if i%50 == 25 && !frameBegins(f) && !frameBegins(newerFrames[i]) {
			f = newerFrames[i]
		}
		someNewer = append(someNewer, f)
	}
	// Every other frame, save one that begins a run of one frame in the
	// first stream (its successor begins the next): this stream's run from
	// it would be that very run, and rightly shared, whenever the next frame
	// it sends begins one too, for 1 in 64³ frames under the process's sums.
	var everyOther, copies [][]byte
	for i, f := range frames {
		if i%2 == 0 && !(frameBegins(f) && i+1 < n && frameBegins(frames[i+1])) {
			everyOther = append(everyOther, f)
		}
		copies = append(copies, bytes.Clone(f))
	}
	var first streamed
	var firstMade int64
	for _, tc := range []struct {
		name   string
		writes [][]byte
		// runs is how many runs the stream compresses: some (1), none (0),
		// or at most half as many as the first stream (-1).
		runs int
		// shares is whether it sends the first stream's members.
		shares bool
	}{
		{name: "the first watch-list", writes: withFlushes(frames, 1000), runs: 1},
		// A copy is known by its bytes, as the frame itself.
		{name: "copies of the frames", writes: withFlushes(copies, 1000), runs: 0, shares: true},
		// It compresses the runs the first's flushes cut.
		{name: "the next, flushed elsewhere", writes: withFlushes(frames, 700), runs: -1, shares: true},
		// A run with one frame not the first stream's is a new one, which
		// replaces the first's: the latest is kept.
		{name: "some objects at a newer version", writes: withFlushes(someNewer, 1000), runs: 1, shares: true},
		{name: "the same again", writes: withFlushes(someNewer, 1000), runs: 0, shares: true},
		// Its runs begin where the first's do, and are not theirs.
		{name: "one selecting every other object", writes: withFlushes(everyOther, 1000), runs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			made, shared := RunsCompressed()
			out := stream(t, tc.writes)
			madeNow, sharedNow := RunsCompressed()
			made, shared = madeNow-made, sharedNow-shared
			if got := oneMember(t, out.body); !bytes.Equal(got, out.sent) {
				t.Fatalf("the stream decompresses to %d bytes, want the %d written:\n%.200q", len(got), len(out.sent), got)
			}
			for _, f := range out.flushed {
				if got := testkit.GzipReadable(out.body[:f[0]]); !bytes.Equal(got, out.sent[:f[1]]) {
					t.Fatalf("after a flush a client reads %d bytes, want %d", len(got), f[1])
				}
			}
			if tc.runs >= 0 && (tc.runs > 0) != (made > 0) || tc.runs < 0 && made > firstMade/2 {
				t.Errorf("%d runs compressed (the first stream %d)", made, firstMade)
			}
			if tc.shares != (shared > 0) {
				t.Errorf("%d runs sent as another stream compressed them", shared)
			}
			// Not a segment an event: each would begin with a Huffman table
			// of its own, which these pods, a few bytes each compressed,
			// would take 30 times the bytes for. Runs of half as many
			// events take twice.
			if together := gzipped(out.sent); len(out.body) > 4*together {
				t.Errorf("%d bytes compressed, %d compressed together", len(out.body), together)
			}
			if first.body == nil {
				first, firstMade = out, made
			}
		})
	}
}

// oneMember returns what body, which must be one gzip member, holds.
func oneMember(t *testing.T, body []byte) []byte {
	t.Helper()
	ms := testkit.GzipMembers(t, body)
	if len(ms) != 1 {
		t.Fatalf("%d gzip members, want 1", len(ms))
	}
	return ms[0]
}

// gzipped returns the length of p compressed at once, as the library would.
func gzipped(p []byte) int {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	_, _ = w.Write(p)
	_ = w.Close()
	return buf.Len()
}

// frameBegins tells whether the watch event frame p begins a run.
func frameBegins(p []byte) bool { return piece{sum: frameSum(p)}.beginsRun() }

// itemBegins tells whether o begins a run as a list's item.
func itemBegins(o *Object) bool { return piece{sum: itemSum(o)}.beginsRun() }

// TestFramesForgotten: a frame is known by its bytes while its encoding
// lives; once the encoding expires and is collected, it is forgotten.
func TestFramesForgotten(t *testing.T) {
	cos, fs := framed(t, 1, "7")
	p := fs[0]
	known := func(p []byte) bool { e, _ := frameOf(p); return e != nil }
	if !known(p) || !known(bytes.Clone(p)) || known(p[:len(p)-1]) {
		t.Fatal("a frame or a copy of it is not known, or a slice of it is")
	}
	cos[0].expire()
	deadline := time.Now().Add(10 * time.Second)
	for {
		goruntime.GC()
		if _, ok := frames.Load(frameSum(p)); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an expired encoding's frame is still known 10s later")
		}
		time.Sleep(time.Millisecond) // the cleanup runs on a goroutine of its own
	}
}

// listed writes objs to a new GzipStream as a list's response: its head,
// the items after their separators, its end. It returns what the stream
// wrote and should decompress to.
func listed(t *testing.T, objs []*Object) streamed {
	t.Helper()
	var body bytes.Buffer
	s := NewGzipStream(&body)
	out := streamed{sent: []byte(`{"kind":"PodList","items":[`)}
	if _, err := s.Write(out.sent); err != nil {
		t.Fatal(err)
	}
	for i, o := range objs {
		prefix := []byte(",{")
		if i == 0 {
			prefix = prefix[1:]
		}
		if err := s.WriteItem(prefix, o); err != nil {
			t.Fatal(err)
		}
		out.sent = append(append(out.sent, prefix...), itemOf(o)...)
	}
	if _, err := s.Write([]byte("]}\n")); err != nil {
		t.Fatal(err)
	}
	out.sent = append(out.sent, "]}\n"...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	out.body = body.Bytes()
	return out
}

// itemOf is o as a list's item: its bytes after the type header, without
// the opening brace a list writes before them, and the final newline.
func itemOf(o *Object) []byte {
	b, err := o.AppendItem(nil)
	if err != nil {
		panic(err)
	}
	return b
}

// TestGzipStreamItems: lists of the same objects share the segments of
// their runs, kept with the Caching of each run's first object; a list
// with some objects changed compresses only the runs they are in, and
// those replace the runs held; each list decompresses to what it wrote.
func TestGzipStreamItems(t *testing.T) {
	const n = 3000
	objs := make([]*Object, n)
	for i := range objs {
		objs[i] = podObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: "ns",
			ResourceVersion: "7"}, Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i%10)}})
		if objs[i].Head == 0 {
			t.Fatal("an object with no type header")
		}
	}
	// A few objects at a newer version, none where a run begins.
	someNewer := slices.Clone(objs)
	changed := 0
	for i := 250; i < n; i += 500 {
		o := podObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: "ns",
			ResourceVersion: "8"}})
		if !itemBegins(o) && !itemBegins(objs[i]) {
			someNewer[i] = o
			changed++
		}
	}
	// A list that begins where a run does: its first item comes after no
	// separator, in the first list after one.
	fromRun := 1
	for !itemBegins(objs[fromRun]) {
		fromRun++
	}
	var first streamed
	var firstMade int64
	for _, tc := range []struct {
		name string
		objs []*Object
		// expire expires the objects' Cachings first.
		expire bool
		// runs is how many runs the list compresses: all of them (1), none
		// (0), or some, at most most (-1).
		runs int
		most int
	}{
		{name: "the first list", objs: objs, runs: 1},
		{name: "the same list", objs: objs, runs: 0},
		{name: "some objects changed", objs: someNewer, runs: -1, most: changed},
		{name: "the same list again", objs: someNewer, runs: 0},
		{name: "from a run's start", objs: someNewer[fromRun:], runs: -1, most: 1},
		{name: "after the Cachings expired", objs: someNewer, expire: true, runs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.expire {
				for _, o := range tc.objs {
					o.Caching(nil).expire()
				}
			}
			made := runsMade.Load()
			out := listed(t, tc.objs)
			made = runsMade.Load() - made
			if got := oneMember(t, out.body); !bytes.Equal(got, out.sent) {
				t.Fatalf("the list decompresses to %d bytes, want the %d written:\n%.200q", len(got), len(out.sent), got)
			}
			if first.body == nil {
				first, firstMade = out, made
			}
			switch {
			case tc.runs == 1 && made < firstMade*9/10, tc.runs == 0 && made != 0,
				tc.runs == -1 && (made == 0 || made > int64(tc.most)):
				t.Errorf("%d runs compressed (the first list %d)", made, firstMade)
			}
			if tc.runs == 1 && made < n/meanRun/2 {
				t.Errorf("%d runs compressed for %d items", made, n)
			}
			// A list that shares nothing compresses a run from every item
			// that begins one, the last too, which ends the list.
			begins := 0
			for _, o := range tc.objs {
				if itemBegins(o) {
					begins++
				}
			}
			if tc.runs == 1 && made != int64(begins) {
				t.Errorf("%d runs compressed, want one for each of the %d items that begin one", made, begins)
			}
		})
	}
}

// TestRunsAcrossCollections: the objects that begin runs live on, and hold
// the runs of the last round's lists, while the others are replaced each
// round by objects of the same names and sizes with other bytes, and the
// old ones are collected, so that new bytes may lie where old ones did.
// Every list must decompress to exactly what it wrote: a held run whose
// bytes differ is compressed anew, and the list after it shares the new one.
func TestRunsAcrossCollections(t *testing.T) {
	const n, rounds = 1500, 8
	pod := func(i, round int) *Object {
		// The same length every round: only the bytes differ.
		return podObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: "ns",
			ResourceVersion: "7"}, Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%02d-%d", round, i%10)}})
	}
	anchors := map[int]*Object{}
	for i := range n {
		if o := pod(i, 0); itemBegins(o) {
			anchors[i] = o
		}
	}
	if len(anchors) < 5 {
		t.Fatalf("only %d of %d objects begin a run", len(anchors), n)
	}
	for round := range rounds {
		objs := make([]*Object, n)
		for i := range objs {
			if objs[i] = anchors[i]; objs[i] == nil {
				objs[i] = pod(i, round)
			}
		}
		for list := range 2 {
			made := runsMade.Load()
			out := listed(t, objs)
			made = runsMade.Load() - made
			if got := oneMember(t, out.body); !bytes.Equal(got, out.sent) {
				t.Fatalf("round %d, list %d decompresses to %d bytes, want the %d written", round, list, len(got), len(out.sent))
			}
			if (list == 0) != (made > 0) {
				t.Fatalf("round %d, list %d: %d runs compressed", round, list, made)
			}
		}
		objs = nil
		goruntime.GC()
		goruntime.GC() // the second frees what the first's cleanups let go
	}
}
