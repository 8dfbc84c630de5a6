package compress

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cached-apiserver/cached-apiserver/internal/corpus"
)

// benchN is how many objects each benchmark corpus holds, to train on and
// to compress: the 1,000–10,000 samples, in the middle.
const benchN = 5000

// benchCorpora are the benchmark's corpora: samples from one seed, the
// objects compressed from another, so that no object is in its dictionary.
var benchCorpora = sync.OnceValue(func() []testCorpus {
	return []testCorpus{
		{name: "assignments", train: corpus.AssignmentsJSON(1, 2*benchN), objects: corpus.AssignmentsJSON(2, benchN)},
		{name: "agents", train: corpus.AgentsJSON(1, 2*benchN), objects: corpus.AgentsJSON(2, benchN)},
		{name: "random", train: corpus.Random(1, 2*benchN), objects: corpus.Random(2, benchN)},
	}
})

// benchAlgorithms are the algorithms and levels the issue asks to compare.
var benchAlgorithms = []struct {
	name  string
	alg   Algorithm
	level Level
}{
	{"zstd-fastest", Zstd, Fast},
	{"zstd-default", Zstd, Better},
	{"s2", S2, Fast},
	{"s2-better", S2, Better},
}

// BenchmarkCodec compresses each object of a corpus on its own, against a
// dictionary trained from other objects of the same corpus, and
// decompresses it: for each algorithm and level, dictionary size (none,
// 16–112 KiB; S2's stop at 64), the way the dictionary was made (samples
// laid end to end, or klauspost's dict builder) and the number of samples.
// ns/op is one object's decompression, into a reused buffer. It reports
// ratio (the records' bytes, headers included, ÷ the objects' JSON),
// compress-ns (mean, into a scratch buffer and copied out, as a store keeps
// records), p50-compress-ns and
// p50-decompress-ns (each object timed alone, about 30 ns of clock
// included), train-ms, and codec-KiB (the heap the Codec holds with its
// dictionary, encoders and decoders, after use on both cores).
//
//	go test -run '^$' -bench 'BenchmarkCodec' -benchtime 20000x -count 3 ./pkg/storage/cacher/internal/compress/
func BenchmarkCodec(b *testing.B) {
	type variant struct {
		dictSize, samples int
		how               trainer
	}
	for _, co := range benchCorpora() {
		for _, a := range benchAlgorithms {
			var variants []variant
			for _, size := range []int{0, 16 << 10, 32 << 10, 64 << 10, 112 << 10} {
				if a.alg == S2 && size > 64<<10 {
					continue
				}
				variants = append(variants, variant{size, benchN, fromSamples})
			}
			if co.name != "random" {
				variants = append(variants, variant{16 << 10, benchN, fromBuilder}, variant{64 << 10, benchN, fromBuilder},
					variant{64 << 10, 1000, fromSamples}, variant{64 << 10, 10000, fromSamples})
			}
			for _, v := range variants {
				name := fmt.Sprintf("%s/%s/dict=%dKiB/trainer=%s/samples=%d", co.name, a.name, v.dictSize>>10, v.how, v.samples)
				if v.dictSize == 0 {
					name = fmt.Sprintf("%s/%s/dict=none", co.name, a.name)
				}
				b.Run(name, func(b *testing.B) {
					cfg := Config{Algorithm: a.alg, Level: a.level, DictSize: v.dictSize}
					benchmarkCodec(b, cfg, co.train[:v.samples], co.objects, v.how)
				})
			}
		}
	}
}

func (t trainer) String() string {
	if t == fromBuilder {
		return "builder"
	}
	return "samples"
}

func benchmarkCodec(b *testing.B, cfg Config, samples, objects [][]byte, how trainer) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c := newCodec(b, cfg)
	start := time.Now()
	if cfg.DictSize > 0 {
		if _, err := c.train(samples, how); err != nil {
			b.Fatal(err)
		}
	}
	trainMs := float64(time.Since(start).Microseconds()) / 1000

	// Warm up on both cores, as a server's readers would, so that every
	// encoder and decoder the Codec keeps is made.
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			var buf []byte
			for _, o := range objects[:200] {
				var err error
				if buf, err = c.Decompress(buf[:0], c.Compress(nil, o)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	runtime.GC()
	runtime.ReadMemStats(&after)
	codecKiB := (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / 1024

	// Compress as a store would: into a scratch buffer, kept as a copy of
	// the record's size.
	recs := make([][]byte, len(objects))
	compressNs := make([]float64, len(objects))
	var raw, stored int
	var scratch []byte
	start = time.Now()
	for i, o := range objects {
		t0 := time.Now()
		scratch = c.Compress(scratch[:0], o)
		recs[i] = bytes.Clone(scratch)
		compressNs[i] = float64(time.Since(t0).Nanoseconds())
		raw += len(o)
		stored += len(recs[i])
	}
	compressMean := float64(time.Since(start).Nanoseconds()) / float64(len(objects))

	decompressNs := make([]float64, len(objects))
	var buf []byte
	for i, rec := range recs {
		t0 := time.Now()
		var err error
		buf, err = c.Decompress(buf[:0], rec)
		decompressNs[i] = float64(time.Since(t0).Nanoseconds())
		if err != nil {
			b.Fatal(err)
		}
	}

	i := 0
	for b.Loop() {
		var err error
		if buf, err = c.Decompress(buf[:0], recs[i]); err != nil {
			b.Fatal(err)
		}
		if i++; i == len(recs) {
			i = 0
		}
	}
	b.ReportMetric(float64(stored)/float64(raw), "ratio")
	b.ReportMetric(compressMean, "compress-ns")
	b.ReportMetric(median(compressNs), "p50-compress-ns")
	b.ReportMetric(median(decompressNs), "p50-decompress-ns")
	b.ReportMetric(trainMs, "train-ms")
	b.ReportMetric(codecKiB, "codec-KiB")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
