package object

import (
	"compress/gzip"
	"fmt"
	"io"
	"math/rand"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/apis/example"
)

// BenchmarkGzipList compresses a list of 10,000 pods of about 1 KiB, an
// annotation of random words each: as the library does, with one
// gzip.Writer (library); through a GzipStream whose runs were all
// compressed before (shared); and through one that compresses every run,
// its objects' runs forgotten before each list (cold), what a list costs
// when no list sent the same objects in the last 10–20 s. Each reports
// the bytes it wrote a list, wire-B. Runs begin where the objects'
// addresses say, so what shared still compresses itself, the items before
// the first run and after the last, moves between runs of the benchmark.
func BenchmarkGzipList(b *testing.B) {
	const n = 10_000
	rnd := rand.New(rand.NewSource(1))
	words := []string{"agent", "zone", "eu", "us", "west", "ready", "payload", "node", "pending", "running", "7", "42", "x9f"}
	objs := make([]*Object, n)
	var size int64
	for i := range objs {
		payload := make([]byte, 0, 1100)
		for len(payload) < 1000 {
			payload = append(append(payload, words[rnd.Intn(len(words))]...), ' ')
		}
		objs[i] = podObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: "ns",
			ResourceVersion: "7", Annotations: map[string]string{"payload": string(payload)}},
			Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i%10)}})
		size += int64(len(itemOf(objs[i])))
	}
	head, end := []byte(`{"kind":"PodList","items":[`), []byte("]}\n")
	prefix := func(i int) []byte {
		if i == 0 {
			return []byte("{")
		}
		return []byte(",{")
	}
	// wire counts what the last list wrote.
	var wire counter
	writeStream := func(w io.Writer) {
		s := NewGzipStream(w)
		_, _ = s.Write(head)
		for i, o := range objs {
			if err := s.WriteItem(prefix(i), o); err != nil {
				b.Fatal(err)
			}
		}
		_, _ = s.Write(end)
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("library", func(b *testing.B) {
		b.SetBytes(size)
		zw, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
		for b.Loop() {
			wire = 0
			zw.Reset(&wire)
			_, _ = zw.Write(head)
			for i, o := range objs {
				_, _ = zw.Write(prefix(i))
				_, _ = zw.Write(itemOf(o))
			}
			_, _ = zw.Write(end)
			_ = zw.Close()
		}
		b.ReportMetric(float64(wire), "wire-B")
	})
	b.Run("cold", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			b.StopTimer()
			for _, o := range objs {
				if co := o.co.Load(); co != nil {
					co.expire()
				}
			}
			b.StartTimer()
			wire = 0
			writeStream(&wire)
		}
		b.ReportMetric(float64(wire), "wire-B")
	})
	b.Run("shared", func(b *testing.B) {
		b.SetBytes(size)
		writeStream(io.Discard)
		for b.Loop() {
			wire = 0
			writeStream(&wire)
		}
		b.ReportMetric(float64(wire), "wire-B")
	})
}

// counter counts the bytes written to it.
type counter int

func (c *counter) Write(p []byte) (int, error) { *c += counter(len(p)); return len(p), nil }

// BenchmarkRegister is what making a watch event's frame known to
// GzipStreams costs each encoding of an event, whether or not a gzip
// watch-list is open: a map entry, a weak pointer and a cleanup.
func BenchmarkRegister(b *testing.B) {
	// Frames at addresses of their own: one byte each of a buffer.
	buf := make([]byte, 1<<20)
	i := 0
	for b.Loop() {
		e := &encoding{raw: buf[i : i+1]}
		e.register()
		i = (i + 1) % len(buf)
	}
}
