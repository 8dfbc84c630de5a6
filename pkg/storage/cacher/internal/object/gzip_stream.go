package object

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/flate"
	"k8s.io/apimachinery/pkg/runtime"
)

// A watch-list's response is compressed when its client asks for gzip
// (k8s.io/apiserver's WatchListCompression), and a list's above 128 KiB,
// and each response compresses its own: informers that start together, and
// clients that list at once, compress the same objects once each. That was
// three quarters of the server's CPU while 100 watch-lists of 10 KiB
// objects streamed, and two thirds of a list's (docs/benchmarks.md,
// Floors). A GzipStream compresses a run of watch event frames that a
// Caching holds, or of the cache's objects as a list's items (WriteItem),
// once, in the first stream that sends the run; every stream that sends
// the same frames in the same order sends that compressed run: the initial
// events of watch-lists, and lists, which send the same objects in key
// order.
//
// A run of each event alone would be simpler, and costs too much: deflate
// writes a Huffman table at every segment's start, which a client must
// read, so that a gzip member an event of 1 KiB took eleven times the bytes
// on the wire, and ten times the client's CPU, that events compressed
// together do.
//
// GzipStream writes one gzip member to w, for one watch's or list's
// response. What is written is compressed in deflate segments, each begun
// with no history: the stream's own bytes, and runs of the frames the cache
// holds, each compressed once and sent by every stream that sends it. Each
// segment ends in a sync flush, byte-aligned, so that segments compressed
// apart follow one another in one deflate stream, and a client reads
// everything up to a segment's end without waiting for more. Only one
// goroutine may use it.
//
// One member for the whole response, not one a run: curl, browsers and
// OkHttp read only a response's first gzip member, or fail on the second
// (curl/curl#22156), and a list is what any client may ask for.
type GzipStream struct {
	w io.Writer

	// started tells whether the member's header is written; crc and size
	// are the CRC-32 and length, mod 2^32, of what the member holds.
	started bool
	crc     uint32
	size    uint32
	// fw is the segment open for the stream's own bytes, or nil.
	fw *flate.Writer
	// pending are frames held back, from one that begins a run; slot is
	// where the first keeps its run, and held what it held then.
	pending []piece
	slot    *atomic.Pointer[run]
	held    *run
	// match is held while the pending frames are its start, else nil.
	match *run
	// scratch is where items' bytes are read to be written.
	scratch []byte
}

// NewGzipStream returns a GzipStream writing to w.
func NewGzipStream(w io.Writer) *GzipStream { return &GzipStream{w: w} }

// flateWriters are the writers GzipStreams compress with, at
// flate.BestSpeed, the level of k8s.io/apiserver's responses: klauspost's
// flate, which writes the same format in half the time of the standard
// library's at that level, and a little smaller (BenchmarkGzipList/cold:
// 51 against 103 ms, 2.43 against 2.51 MB, for 10,000 objects of 1 KiB).
// A first gzip list of a million objects is mostly this compression.
var flateWriters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestSpeed) // a valid level: no error
	return w
}}

// gzipHeader begins a member (RFC 1952): no name, no time, the fastest
// level (XFL 4), as compress/gzip writes it at flate.BestSpeed.
var gzipHeader = []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255}

// Write implements io.Writer.
func (s *GzipStream) Write(p []byte) (int, error) {
	e, sum := frameOf(p)
	if e == nil {
		if err := s.endRun(); err != nil {
			return 0, err
		}
		if err := s.own(p); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if err := s.frame(piece{frame: p, sum: sum}, func() *atomic.Pointer[run] { return &e.run }); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteItem writes prefix and then item as a list's item, which the list's
// encoder writes as the object's bytes (Object.ListItem): the separator and
// what AppendItem appends, after the open ListItem returned, which prefix
// ends with. Runs of the cache's objects are sent as segments shared with
// every list that sends them, kept while their first object's Caching
// lives, and their bytes are read only for a run compressed now, never for
// one shared. Another item is written as AppendItem appends it.
func (s *GzipStream) WriteItem(prefix []byte, item runtime.Object) error {
	o, ok := item.(*Object)
	if !ok {
		a, ok := item.(interface{ AppendItem([]byte) ([]byte, error) })
		if !ok {
			return fmt.Errorf("a list's item of type %T has no bytes of its own", item)
		}
		frame, err := a.AppendItem(s.scratch[:0])
		if err != nil {
			return err
		}
		s.scratch = frame
		if err := s.endRun(); err != nil {
			return err
		}
		return s.ownPiece(piece{prefix: prefix, frame: frame})
	}
	pc := piece{prefix: prefix, item: o, sum: itemSum(o)}
	return s.frame(pc, func() *atomic.Pointer[run] { return &o.Caching(o.Codec.expiry).listRun })
}

// frame writes pc, whose frame the cache holds; slotOf returns where the
// run it begins is kept.
func (s *GzipStream) frame(pc piece, slotOf func() *atomic.Pointer[run]) error {
	if len(s.pending) > 0 {
		if pc.beginsRun() || len(s.pending) == maxRun {
			if err := s.complete(); err != nil {
				return err
			}
		} else {
			if m := s.match; m != nil && (len(s.pending) == len(m.pieces) || !m.pieces[len(s.pending)].is(pc)) {
				s.match = nil // a run of this stream's own, to replace the one held
			}
			s.pending = append(s.pending, pc)
			return nil
		}
	}
	if !pc.beginsRun() {
		return s.ownPiece(pc)
	}
	s.slot = slotOf()
	s.held = s.slot.Load()
	s.match = s.held
	if s.match != nil && !s.match.pieces[0].is(pc) {
		s.match = nil
	}
	s.pending = append(s.pending[:0], pc)
	return nil
}

// Flush ends the open segment: a client then reads everything written.
func (s *GzipStream) Flush() error {
	if err := s.release(); err != nil {
		return err
	}
	return s.endOwn()
}

// Close ends the member: its last block and its trailer.
func (s *GzipStream) Close() error {
	if err := s.endRun(); err != nil {
		return err
	}
	if err := s.Flush(); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	fw := flateWriters.Get().(*flate.Writer)
	defer flateWriters.Put(fw)
	fw.Reset(s.w)
	if err := fw.Close(); err != nil { // an empty final block
		return err
	}
	_, err := s.w.Write(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, s.crc), s.size))
	return err
}

// start writes the member's header, once.
func (s *GzipStream) start() error {
	if s.started {
		return nil
	}
	s.started = true
	_, err := s.w.Write(gzipHeader)
	return err
}

// sum adds p to what the member holds.
func (s *GzipStream) sum(p []byte) {
	s.crc = crc32.Update(s.crc, crc32.IEEETable, p)
	s.size += uint32(len(p))
}

// own writes p into the stream's own segment.
func (s *GzipStream) own(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	if err := s.start(); err != nil {
		return err
	}
	if s.fw == nil {
		s.fw = flateWriters.Get().(*flate.Writer)
		s.fw.Reset(s.w)
	}
	s.sum(p)
	_, err := s.fw.Write(p)
	return err
}

// ownPiece writes pc into the stream's own segment.
func (s *GzipStream) ownPiece(pc piece) error {
	if err := s.own(pc.prefix); err != nil {
		return err
	}
	if pc.item == nil {
		return s.own(pc.frame)
	}
	b, err := pc.item.AppendItem(s.scratch[:0])
	s.scratch = b
	if err != nil {
		return err
	}
	return s.own(b)
}

// endRun sends the pending frames as a run: what follows them is the
// stream's own bytes, or its end, which every stream that sends the same
// content sends after the same frames (a list's end, or the bookmark after
// a watch-list's initial events), so that a run that ends there is shared
// as one that ends where the next begins is. A flush is no such place: it
// comes when the stream pauses, and releases the frames instead.
func (s *GzipStream) endRun() error {
	if len(s.pending) == 0 {
		return nil
	}
	return s.complete()
}

// release writes the pending frames into the stream's own segment.
func (s *GzipStream) release() error {
	for _, pc := range s.pending {
		if err := s.ownPiece(pc); err != nil {
			return err
		}
	}
	s.clear()
	return nil
}

func (s *GzipStream) clear() {
	clear(s.pending) // no frames held past their send
	s.pending, s.slot, s.held, s.match = s.pending[:0], nil, nil, nil
}

// complete sends the pending frames, a whole run, as the run's segment:
// the one another stream made for them, or one made now and kept for the
// next in place of the run held, unless another stream replaced it
// meanwhile.
func (s *GzipStream) complete() error {
	r := s.match
	if r == nil || len(r.pieces) != len(s.pending) {
		r = &run{pieces: append([]piece(nil), s.pending...)}
		var err error
		if s.scratch, err = r.deflate(s.scratch); err != nil {
			return err
		}
		if r.deflated == nil {
			return s.release()
		}
		s.slot.CompareAndSwap(s.held, r)
		runsMade.Add(1)
	} else {
		runsShared.Add(1)
	}
	s.clear()
	// The own segment ends first: what it compresses next may not refer
	// to bytes before the run's, which its history no longer ends with.
	if err := s.endOwn(); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	s.crc = crc32Combine(s.crc, r.crc, r.size)
	s.size += uint32(r.size)
	_, err := s.w.Write(r.deflated)
	return err
}

// endOwn ends the stream's own segment, if one is open, in a sync flush.
func (s *GzipStream) endOwn() error {
	if s.fw == nil {
		return nil
	}
	err := s.fw.Flush()
	s.fw.Reset(io.Discard) // the pool holds no response
	flateWriters.Put(s.fw)
	s.fw = nil
	return err
}
