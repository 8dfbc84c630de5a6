package object

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	goruntime "runtime"
	"testing"
	"testing/iotest"
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

// readable returns what a client's gzip reader hands on, before it must
// wait, from a stream that has sent body so far: Go's gzip reader returns
// the data a member ends with only once it reads the next member's header,
// unless the data ends in a flush.
func readable(body []byte) []byte {
	r, err := gzip.NewReader(io.MultiReader(bytes.NewReader(body), iotest.ErrReader(errors.New("nothing more sent yet"))))
	if err != nil {
		return nil
	}
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		if err != nil {
			return out // with an error, the reader was waiting for more
		}
		out = append(out, buf[:n]...)
	}
}

// TestGzipStream: streams that send the same frames of the cache's in the
// same order share the members of their runs, compressed by the first;
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
		if i%50 == 25 && !beginsRun(f) && !beginsRun(newerFrames[i]) {
			f = newerFrames[i]
		}
		someNewer = append(someNewer, f)
	}
	var everyOther, copies [][]byte
	for i, f := range frames {
		if i%2 == 0 {
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
		// It compresses the runs the first's flushes cut.
		{name: "the next, flushed elsewhere", writes: withFlushes(frames, 700), runs: -1, shares: true},
		// Its runs begin where the first's do, and are not theirs: it
		// compresses them as its own.
		{name: "one selecting every other object", writes: withFlushes(everyOther, 1000), runs: 0},
		// A run with one frame not the first stream's is its own.
		{name: "some objects at a newer version", writes: withFlushes(someNewer, 1000), runs: 0, shares: true},
		{name: "copies of the frames", writes: withFlushes(copies, 1000), runs: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			made := runsMade.Load()
			out := stream(t, tc.writes)
			made = runsMade.Load() - made
			ms := testkit.GzipMembers(t, out.body)
			if got := bytes.Join(ms, nil); !bytes.Equal(got, out.sent) {
				t.Fatalf("the stream decompresses to %d bytes, want the %d written:\n%.200q", len(got), len(out.sent), got)
			}
			for _, f := range out.flushed {
				if got := readable(out.body[:f[0]]); !bytes.Equal(got, out.sent[:f[1]]) {
					t.Fatalf("after a flush a client reads %d bytes, want %d", len(got), f[1])
				}
			}
			if tc.runs >= 0 && (tc.runs > 0) != (made > 0) || tc.runs < 0 && made > firstMade/2 {
				t.Errorf("%d runs compressed (the first stream %d)", made, firstMade)
			}
			if first.body == nil {
				first, firstMade = out, made
				// Not an event a member: each would begin with a Huffman
				// table of its own.
				if len(ms) > n/16 {
					t.Errorf("%d members for %d events", len(ms), n)
				}
				return
			}
			shared := 0
			for _, m := range ms {
				if len(m) > len(frames[0]) && bytes.Contains(first.body, gzipMember([][]byte{m})) {
					shared++
				}
			}
			if tc.shares != (shared > 0) {
				t.Errorf("%d members of the first stream's sent", shared)
			}
		})
	}
}

// TestFramesForgotten: once a frame's encoding expires and is collected,
// the frame is forgotten, and a slice at its address is no longer it.
func TestFramesForgotten(t *testing.T) {
	cos, fs := framed(t, 1, "7")
	p := fs[0]
	if frameOf(p) == nil || frameOf(bytes.Clone(p)) != nil || frameOf(p[:len(p)-1]) != nil {
		t.Fatal("a frame is not known by its bytes, or a copy or a slice of it is")
	}
	cos[0].expire()
	deadline := time.Now().Add(10 * time.Second)
	for {
		goruntime.GC()
		if _, ok := frames.Load(addressOf(p)); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an expired encoding's frame is still known 10s later")
		}
		time.Sleep(time.Millisecond) // the cleanup runs on a goroutine of its own
	}
}
