package compress

import (
	"bytes"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/klauspost/compress/dict"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Dictionary is one trained dictionary, or none (id 0), with what
// compresses and decompresses against it. It is immutable and safe for
// concurrent use. Whoever keeps a record may keep the Dictionary it needs
// beside it (CompressTo, DecompressWith): the dictionary then lives as long
// as a record needs it, whatever the Codec retired.
type Dictionary struct {
	id uint32
	// s2 is S2's dictionary; nil for zstd, or for S2 without one.
	s2 *s2.Dict
	// enc and dec are zstd's, the dictionary loaded; nil for S2.
	enc *zstd.Encoder
	dec *zstd.Decoder
}

// zstdMagic starts every zstd frame; records leave it out.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// trainer is how a dictionary's content is chosen from the samples.
type trainer uint8

const (
	// fromSamples lays the last samples end to end, as much as fits. On the
	// realistic corpus it beats klauspost's dict builder at every size and
	// level, by a sixth to nearly a third of the compressed bytes, and
	// trains in a millisecond for S2 (BenchmarkCodec, trainer=…).
	fromSamples trainer = iota
	// fromBuilder is what klauspost/compress/dict builds: the substrings the
	// samples repeat most. Only the benchmark uses it, to compare.
	fromBuilder
)

// builderHashBytes is the shortest match the dict builder indexes: of 4–8,
// 8 compressed the realistic corpus best, tried once by hand.
const builderHashBytes = 8

// zstdOffsets are the repeat offsets a zstd dictionary starts with: the
// format's defaults.
var zstdOffsets = [3]int{1, 4, 8}

// newDictionary trains dictionary id from samples with cfg's algorithm and
// level, or makes the empty one when samples is nil.
func newDictionary(cfg Config, id uint32, samples [][]byte, how trainer) (*Dictionary, error) {
	d := &Dictionary{id: id}
	switch cfg.Algorithm {
	case S2:
		if samples == nil {
			return d, nil
		}
		if how == fromBuilder {
			raw, err := dict.BuildS2Dict(samples, dict.Options{MaxDictSize: cfg.DictSize, HashBytes: builderHashBytes})
			if err != nil {
				return nil, fmt.Errorf("compress: training an S2 dictionary: %w", err)
			}
			d.s2 = s2.NewDict(raw)
		} else {
			// S2 starts matching at the dictionary's repeat offset: where
			// the samples' common start last appears. 64 bytes hold the
			// {"kind":…,"apiVersion":…,"metadata":{"name":" that every
			// object of a resource starts with.
			d.s2 = s2.MakeDict(content(samples, cfg.DictSize), commonPrefix(samples, 64))
		}
		if d.s2 == nil {
			return nil, fmt.Errorf("compress: no S2 dictionary from %d samples", len(samples))
		}
		return d, nil
	case Zstd:
		level := zstd.SpeedFastest
		if cfg.Level == Better {
			level = zstd.SpeedDefault
		}
		procs := runtime.GOMAXPROCS(0)
		eopts := []zstd.EOption{zstd.WithEncoderLevel(level), zstd.WithEncoderCRC(false), zstd.WithEncoderConcurrency(procs)}
		dopts := []zstd.DOption{zstd.WithDecoderConcurrency(procs), zstd.WithDecoderMaxMemory(uint64(cfg.MaxSize))}
		if samples != nil {
			var raw []byte
			var err error
			if how == fromBuilder {
				raw, err = dict.BuildZstdDict(samples, dict.Options{MaxDictSize: cfg.DictSize, HashBytes: builderHashBytes, ZstdDictID: id, ZstdLevel: level})
			} else {
				// The samples' content, with entropy tables made from
				// compressing the samples against it.
				raw, err = zstd.BuildDict(zstd.BuildDictOptions{ID: id, Contents: samples, History: content(samples, cfg.DictSize), Offsets: zstdOffsets, Level: level})
			}
			if err != nil {
				return nil, fmt.Errorf("compress: training a zstd dictionary: %w", err)
			}
			eopts = append(eopts, zstd.WithEncoderDict(raw))
			dopts = append(dopts, zstd.WithDecoderDicts(raw))
		}
		var err error
		if d.enc, err = zstd.NewWriter(nil, eopts...); err != nil {
			return nil, fmt.Errorf("compress: zstd encoder: %w", err)
		}
		if d.dec, err = zstd.NewReader(nil, dopts...); err != nil {
			return nil, fmt.Errorf("compress: zstd decoder: %w", err)
		}
		return d, nil
	}
	return nil, fmt.Errorf("compress: unknown algorithm %d", cfg.Algorithm)
}

// content returns the last samples laid end to end, the last one last, cut
// to size bytes: what a dictionary of samples holds. Which samples made no
// difference on the realistic corpus (all, the small ones, those without
// secrets): any dozens of a resource's objects hold what they all repeat.
func content(samples [][]byte, size int) []byte {
	n, first := 0, len(samples)
	for first > 0 && n < size {
		first--
		n += len(samples[first])
	}
	out := slices.Concat(samples[first:]...)
	return out[max(0, len(out)-size):]
}

// commonPrefix returns the longest prefix of at most n bytes all samples
// start with.
func commonPrefix(samples [][]byte, n int) []byte {
	p := samples[0][:min(n, len(samples[0]))]
	for _, s := range samples[1:] {
		i := 0
		for i < len(p) && i < len(s) && p[i] == s[i] {
			i++
		}
		p = p[:i]
	}
	return p
}

// encode appends src compressed to dst; ok is false, and dst as it was,
// when it made nothing to keep.
func (d *Dictionary) encode(dst, src []byte, level Level) (_ []byte, ok bool) {
	if d.enc != nil {
		at := len(dst)
		dst = d.enc.EncodeAll(src, dst)
		if !bytes.HasPrefix(dst[at:], zstdMagic) {
			return dst[:at], false // nothing, for an empty src
		}
		return append(dst[:at], dst[at+len(zstdMagic):]...), true
	}
	dst = slices.Grow(dst, s2.MaxEncodedLen(len(src)))
	spare := dst[len(dst):cap(dst)]
	var out []byte
	switch {
	case d.s2 != nil && level == Better:
		out = d.s2.EncodeBetter(spare, src)
	case d.s2 != nil:
		out = d.s2.Encode(spare, src)
	case level == Better:
		out = s2.EncodeBetter(spare, src)
	default:
		out = s2.Encode(spare, src)
	}
	return append(dst, out...), true // out is spare's start: the copy is onto itself
}

// decode appends payload decompressed to dst, refusing more than limit
// bytes.
func (d *Dictionary) decode(dst, payload []byte, limit int) ([]byte, error) {
	if d.dec != nil {
		frame := framePool.Get().(*[]byte)
		defer framePool.Put(frame)
		*frame = append(append((*frame)[:0], zstdMagic...), payload...)
		return d.dec.DecodeAll(*frame, dst)
	}
	n, err := s2.DecodedLen(payload)
	if err != nil {
		return dst, err
	}
	if n > limit {
		return dst, fmt.Errorf("%d bytes, more than %d", n, limit)
	}
	dst = slices.Grow(dst, n)
	spare := dst[len(dst) : len(dst)+n]
	var out []byte
	if d.s2 != nil {
		out, err = d.s2.Decode(spare, payload)
	} else {
		out, err = s2.Decode(spare, payload)
	}
	if err != nil {
		return dst, err
	}
	return append(dst, out...), nil
}

// framePool holds the buffers a zstd frame is put back together in, its
// magic before the record's payload.
var framePool = sync.Pool{New: func() any { return new([]byte) }}

// zstdLen returns the length of the object a zstd record's payload holds,
// from its frame header, which EncodeAll writes with the content's size.
func zstdLen(payload []byte) (int, error) {
	var frame [4 + zstd.HeaderMaxSize]byte // zstdMagic, then the header
	n := copy(frame[copy(frame[:], zstdMagic):], payload)
	var h zstd.Header
	if err := h.Decode(frame[:len(zstdMagic)+n]); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if !h.HasFCS || h.FrameContentSize > math.MaxInt32 {
		return 0, fmt.Errorf("%w: no content size in the frame", ErrCorrupt)
	}
	return int(h.FrameContentSize), nil
}
