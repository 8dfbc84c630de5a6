package compress

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"weak"
)

// TestCompressTo: a record kept beside the dictionary CompressTo names
// reads back byte for byte with DecompressWith after a retrain retired
// that dictionary, Len tells its object's length without decompressing,
// and a record read against another dictionary than its own is refused.
func TestCompressTo(t *testing.T) {
	for _, cfg := range configs {
		for _, tc := range corpora() {
			t.Run(cfg.name+"/"+tc.name, func(t *testing.T) {
				c := newCodec(t, cfg.cfg)
				first, err := c.Train(tc.train)
				if err != nil {
					t.Fatal(err)
				}
				type kept struct {
					rec []byte
					d   *Dictionary
				}
				recs := make([]kept, len(tc.objects))
				for i, obj := range tc.objects {
					rec, d := c.CompressTo(nil, obj)
					if d == nil {
						t.Fatalf("object %d: no dictionary", i)
					}
					if d.ID() != 0 && d != c.Current() {
						t.Fatalf("object %d: compressed against dictionary %d, not the current one", i, d.ID())
					}
					recs[i] = kept{rec, d}
				}
				if _, err := c.Train(tc.retrain); err != nil {
					t.Fatal(err)
				}
				c.Retire(first)
				for i, k := range recs {
					n, err := Len(k.rec)
					if err != nil || n != len(tc.objects[i]) {
						t.Fatalf("object %d: Len %d, %v, want %d", i, n, err, len(tc.objects[i]))
					}
					got, err := c.DecompressWith(nil, k.rec, k.d)
					if err != nil || !bytes.Equal(got, tc.objects[i]) {
						t.Fatalf("object %d after a retrain: %v, or other bytes", i, err)
					}
					if k.d.ID() == 0 {
						continue // kept as it is: any dictionary reads it
					}
					if _, err := c.DecompressWith(nil, k.rec, c.Current()); !errors.Is(err, ErrUnknownDictionary) {
						t.Fatalf("object %d against another dictionary: %v, want ErrUnknownDictionary", i, err)
					}
				}
			})
		}
	}
}

// TestRetiredDictionaryCollected: a dictionary retired from the table is
// collected once no record's keeper holds it.
func TestRetiredDictionaryCollected(t *testing.T) {
	c := newCodec(t, Config{Algorithm: S2, DictSize: 16 << 10})
	tc := corpora()[0]
	first, err := c.Train(tc.train)
	if err != nil {
		t.Fatal(err)
	}
	rec, d := c.CompressTo(nil, tc.objects[0])
	w := weak.Make(d)
	if _, err := c.Train(tc.retrain); err != nil {
		t.Fatal(err)
	}
	if !c.Retire(first) {
		t.Fatal("the first dictionary was not retired")
	}
	runtime.GC()
	if w.Value() == nil {
		t.Fatal("collected while a record's keeper held it")
	}
	if got, err := c.DecompressWith(nil, rec, d); err != nil || !bytes.Equal(got, tc.objects[0]) {
		t.Fatalf("after Retire: %v", err)
	}
	d = nil
	runtime.GC()
	if w.Value() != nil {
		t.Fatal("a retired dictionary no record needs was kept")
	}
	if c.Retire(0) {
		t.Fatal("the empty dictionary was retired")
	}
}
