package compress

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/corpus"
)

// The tests' corpora: small enough for the race detector (test-race runs
// this package with -race), large enough to train on.
const (
	trainN = 150
	testN  = 200
)

// configs are every algorithm and level, with a dictionary small enough to
// train quickly.
var configs = []struct {
	name string
	cfg  Config
}{
	{"s2", Config{Algorithm: S2, DictSize: 16 << 10}},
	{"s2-better", Config{Algorithm: S2, Level: Better, DictSize: 16 << 10}},
	{"zstd-fastest", Config{Algorithm: Zstd, DictSize: 16 << 10}},
	{"zstd-default", Config{Algorithm: Zstd, Level: Better, DictSize: 16 << 10}},
}

// corpora are the realistic corpus, each resource on its own as the cache
// trains per resource, and the random one: samples to train on and
// objects to compress, from different seeds.
var corpora = sync.OnceValue(func() []testCorpus {
	return []testCorpus{
		{"assignments", corpus.AssignmentsJSON(1, trainN), corpus.AssignmentsJSON(2, testN), corpus.AssignmentsJSON(3, trainN)},
		{"agents", corpus.AgentsJSON(1, trainN), corpus.AgentsJSON(2, testN), corpus.AgentsJSON(3, trainN)},
		{"random", corpus.Random(1, trainN), corpus.Random(2, testN), corpus.Random(3, trainN)},
	}
})

type testCorpus struct {
	name string
	// train and retrain are samples for a first and a second dictionary.
	train, objects, retrain [][]byte
}

func newCodec(t testing.TB, cfg Config) *Codec {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRoundTrip compresses every object without a dictionary, with one,
// and with a second, and reads every record back after each: byte for
// byte what was compressed.
func TestRoundTrip(t *testing.T) {
	for _, cc := range configs {
		for _, co := range corpora() {
			t.Run(cc.name+"/"+co.name, func(t *testing.T) {
				c := newCodec(t, cc.cfg)
				var recs [][]byte
				compressAll := func() {
					for _, o := range co.objects {
						recs = append(recs, c.Compress(nil, o))
					}
				}
				compressAll() // dictionary 0: none
				for _, samples := range [][][]byte{co.train, co.retrain} {
					if _, err := c.Train(samples); err != nil {
						t.Fatal(err)
					}
					compressAll()
				}
				var raw, stored int
				buf := []byte("prefix")
				for i, rec := range recs {
					want := co.objects[i%len(co.objects)]
					got, err := c.Decompress(buf, rec)
					if err != nil {
						t.Fatalf("record %d (dictionary %d): %v", i, dictOf(t, rec), err)
					}
					if !bytes.HasPrefix(got, []byte("prefix")) || !bytes.Equal(got[len("prefix"):], want) {
						t.Fatalf("record %d (dictionary %d) decompressed to other bytes", i, dictOf(t, rec))
					}
					if i >= 2*len(co.objects) {
						raw += len(want)
						stored += len(rec)
					}
				}
				ratio := float64(stored) / float64(raw)
				t.Logf("ratio %.3f", ratio)
				// The realistic corpus compresses; the random one is kept
				// as it is, with its header.
				if co.name == "random" && ratio > 1.01 || co.name != "random" && ratio > 0.5 {
					t.Errorf("ratio %.3f", ratio)
				}
			})
		}
	}
}

func dictOf(t *testing.T, rec []byte) uint32 {
	id, err := DictionaryID(rec)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestCorruptRefused damages records every way a byte can be damaged:
// each bit flipped, cut short, grown, another format, another dictionary.
// Decompress must refuse each, or return exactly the object, never other
// bytes.
func TestCorruptRefused(t *testing.T) {
	co := corpora()[0]
	objects := append(slices.Clone(co.objects[:2]), corpus.Random(4, 1)[0][:600])
	for _, cc := range configs {
		t.Run(cc.name, func(t *testing.T) {
			c := newCodec(t, cc.cfg)
			var recs [][]byte
			for _, samples := range [][][]byte{co.train, co.retrain} {
				if _, err := c.Train(samples); err != nil {
					t.Fatal(err)
				}
				for _, o := range objects {
					recs = append(recs, c.Compress(nil, o))
				}
			}
			var tried, refused int
			check := func(what string, i int, damaged []byte) {
				t.Helper()
				tried++
				got, err := c.Decompress(nil, damaged)
				switch {
				case err == nil && !bytes.Equal(got, objects[i%len(objects)]):
					t.Fatalf("record %d, %s: returned other bytes than were compressed", i, what)
				case err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownDictionary):
					t.Fatalf("record %d, %s: %v, want ErrCorrupt or ErrUnknownDictionary", i, what, err)
				case err != nil:
					refused++
				}
			}
			for i, rec := range recs {
				for bit := range 8 * len(rec) {
					damaged := slices.Clone(rec)
					damaged[bit/8] ^= 1 << (bit % 8)
					check(fmt.Sprintf("bit %d flipped", bit), i, damaged)
				}
				for n := range len(rec) {
					check(fmt.Sprintf("cut to %d bytes", n), i, rec[:n])
				}
				check("a byte added", i, append(slices.Clone(rec), 0))
				for f := range 256 {
					if byte(f) != rec[0] {
						damaged := slices.Clone(rec)
						damaged[0] = byte(f)
						check(fmt.Sprintf("format %#x", f), i, damaged)
					}
				}
				if rec[0] != formatStored {
					damaged := slices.Clone(rec)
					damaged[headerSize] = 3 - damaged[headerSize] // dictionary 1 ↔ 2
					check("the other dictionary", i, damaged)
				}
			}
			t.Logf("%d of %d damaged records refused, the rest read right", refused, tried)
		})
	}
}

func TestRetire(t *testing.T) {
	co := corpora()[0]
	c := newCodec(t, configs[0].cfg)
	first, err := c.Train(co.train)
	if err != nil {
		t.Fatal(err)
	}
	old := c.Compress(nil, co.objects[0])
	second, err := c.Train(co.retrain)
	if err != nil {
		t.Fatal(err)
	}
	current := c.Compress(nil, co.objects[0])
	if dictOf(t, old) != first || dictOf(t, current) != second {
		t.Fatalf("records of dictionaries %d and %d, want %d and %d", dictOf(t, old), dictOf(t, current), first, second)
	}

	tests := []struct {
		name string
		id   uint32
		want bool
	}{
		{"the current one stays", second, false},
		{"one never trained", 7, false},
		{"an old one goes", first, true},
		{"only once", first, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.Retire(tt.id); got != tt.want {
				t.Errorf("Retire(%d) = %v, want %v", tt.id, got, tt.want)
			}
		})
	}
	if _, err := c.Decompress(nil, old); !errors.Is(err, ErrUnknownDictionary) {
		t.Errorf("a record of a retired dictionary: %v, want ErrUnknownDictionary", err)
	}
	if got, err := c.Decompress(nil, current); err != nil || !bytes.Equal(got, co.objects[0]) {
		t.Errorf("a record of the current dictionary: %v", err)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"s2", Config{Algorithm: S2}, false},
		{"zstd", Config{Algorithm: Zstd, Level: Better, DictSize: 112 << 10}, false},
		{"no algorithm", Config{}, true},
		{"an unknown algorithm", Config{Algorithm: 9}, true},
		{"an unknown level", Config{Algorithm: S2, Level: 2}, true},
		{"an S2 dictionary past 64 KiB", Config{Algorithm: S2, DictSize: 64<<10 + 1}, true},
		{"a negative size", Config{Algorithm: Zstd, MaxSize: -1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); (err != nil) != tt.wantErr {
				t.Errorf("New: %v, want an error: %v", err, tt.wantErr)
			}
		})
	}
}

func TestTrainFails(t *testing.T) {
	tests := []struct {
		name    string
		samples [][]byte
	}{
		{"no samples", nil},
		{"too little to make a dictionary of", [][]byte{[]byte("{}")}},
	}
	for _, cc := range configs {
		for _, tt := range tests {
			t.Run(cc.name+"/"+tt.name, func(t *testing.T) {
				c := newCodec(t, cc.cfg)
				if _, err := c.Train(tt.samples); err == nil {
					t.Fatal("Train succeeded")
				}
				obj := corpora()[0].objects[0]
				rec := c.Compress(nil, obj)
				if got, err := c.Decompress(nil, rec); dictOf(t, rec) != 0 || err != nil || !bytes.Equal(got, obj) {
					t.Errorf("after a failed Train: dictionary %d, %v", dictOf(t, rec), err)
				}
			})
		}
	}
}

// TestMaxSize: a record of more than MaxSize bytes is refused by a Codec
// that allows less, as a corrupted length would be, before allocating.
func TestMaxSize(t *testing.T) {
	obj := bytes.Repeat([]byte(`{"a":"b"},`), 1000)
	for _, cc := range configs {
		t.Run(cc.name, func(t *testing.T) {
			big := newCodec(t, cc.cfg)
			cfg := cc.cfg
			cfg.MaxSize = len(obj) - 1
			small := newCodec(t, cfg)
			if _, err := small.Decompress(nil, big.Compress(nil, obj)); !errors.Is(err, ErrCorrupt) {
				t.Errorf("%d bytes with MaxSize %d: %v, want ErrCorrupt", len(obj), cfg.MaxSize, err)
			}
		})
	}
}

// TestConcurrent reads and writes records while dictionaries are trained
// and retired; test-race runs it under the race detector.
func TestConcurrent(t *testing.T) {
	co := corpora()[1]
	for _, cc := range configs {
		t.Run(cc.name, func(t *testing.T) {
			c := newCodec(t, cc.cfg)
			var wg sync.WaitGroup
			done := make(chan struct{})
			wg.Go(func() {
				defer close(done)
				for range 3 {
					id, err := c.Train(co.train)
					if err != nil {
						t.Error(err)
						return
					}
					c.Retire(id - 1)
				}
			})
			for range 2 {
				wg.Go(func() {
					var buf []byte
					for i := 0; ; i++ {
						select {
						case <-done:
							return
						default:
						}
						obj := co.objects[i%len(co.objects)]
						got, err := c.Decompress(buf[:0], c.Compress(nil, obj))
						// A record whose dictionary was retired between the
						// two calls is refused; any other must read right.
						if err != nil && !errors.Is(err, ErrUnknownDictionary) || err == nil && !bytes.Equal(got, obj) {
							t.Errorf("object %d: %v", i, err)
							return
						}
						buf = got
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestSmallAndOdd round-trips what no resource holds but a Codec must
// still read back: nothing, a byte, runs, noise.
func TestSmallAndOdd(t *testing.T) {
	objects := []struct {
		name string
		obj  []byte
	}{
		{"empty", []byte{}},
		{"one byte", []byte("{")},
		{"31 bytes", []byte(`{"kind":"Agent","metadata":{}}` + "\n")},
		{"a run", bytes.Repeat([]byte("a"), 100_000)},
		{"noise", corpus.Random(5, 1)[0]},
	}
	for _, cc := range configs {
		c := newCodec(t, cc.cfg)
		for _, trained := range []bool{false, true} {
			if trained {
				if _, err := c.Train(corpora()[0].train); err != nil {
					t.Fatal(err)
				}
			}
			for _, o := range objects {
				t.Run(fmt.Sprintf("%s/trained=%v/%s", cc.name, trained, o.name), func(t *testing.T) {
					rec := c.Compress(nil, o.obj)
					got, err := c.Decompress(nil, rec)
					if err != nil || !bytes.Equal(got, o.obj) {
						t.Fatalf("%d bytes, record of %d: %v", len(o.obj), len(rec), err)
					}
					if len(rec) > len(o.obj)+headerSize {
						t.Errorf("a record of %d bytes for %d, more than stored", len(rec), len(o.obj))
					}
				})
			}
		}
	}
}
