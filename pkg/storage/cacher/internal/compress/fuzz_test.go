package compress

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecompress gives Decompress any bytes, starting from records of
// every format: it must refuse them or return bytes whose checksum they
// carry, and never panic nor allocate more than MaxSize; DecompressWith,
// against the current dictionary, must read what Decompress reads, and Len
// never tell another length. Its seeds run in go test; go test -fuzz
// FuzzDecompress searches further.
func FuzzDecompress(f *testing.F) {
	co := corpora()[0]
	var codecs []*Codec
	for _, cc := range configs {
		cfg := cc.cfg
		cfg.MaxSize = 1 << 20
		c := newCodec(f, cfg)
		f.Add(c.Compress(nil, co.objects[0])) // without a dictionary
		if _, err := c.Train(co.train); err != nil {
			f.Fatal(err)
		}
		for _, o := range co.objects[:4] {
			f.Add(c.Compress(nil, o))
		}
		codecs = append(codecs, c)
	}
	f.Add(codecs[0].Compress(nil, corpora()[2].objects[0])) // stored
	f.Add([]byte{formatZstd, 0, 0, 0, 0, 1})
	f.Add([]byte{formatS2, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}) // claims 4 GiB

	f.Fuzz(func(t *testing.T, rec []byte) {
		for _, c := range codecs {
			got, err := c.Decompress(nil, rec)
			with, errWith := c.DecompressWith(nil, rec, c.Current())
			if (err == nil) != (errWith == nil) || !bytes.Equal(got, with) {
				// Only a record of another dictionary than the current one
				// (which a stored record names none of) reads with one and
				// not the other.
				if id, err := DictionaryID(rec); err == nil && id == c.Current().ID() && rec[0] != formatStored {
					t.Fatalf("Decompress: %v; DecompressWith the current dictionary: %v, or other bytes", err, errWith)
				}
			}
			if n, lenErr := Len(rec); err == nil && lenErr == nil && n != len(got) {
				t.Fatalf("Len %d of a record that reads to %d bytes", n, len(got))
			}
			if err != nil {
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownDictionary) {
					t.Fatalf("%v, want ErrCorrupt or ErrUnknownDictionary", err)
				}
				continue
			}
			// A record read is one Compress could have written: its bytes
			// compress and read back.
			back, err := c.Decompress(nil, c.Compress(nil, got))
			if err != nil || !bytes.Equal(back, got) {
				t.Fatalf("what a record read to does not round-trip: %v", err)
			}
		}
	})
}
