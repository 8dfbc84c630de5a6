package object

import (
	"bytes"
	"compress/gzip"
	"io"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"unsafe"
	"weak"
)

// A watch-list's response is compressed when its client asks for gzip
// (k8s.io/apiserver's WatchListCompression), and each watch compresses its
// own: informers that start together compress the same events once each,
// three quarters of the server's CPU while 100 watch-lists of 10 KiB
// objects streamed (docs/benchmarks.md, Floors). A gzip stream may be a
// series of members, each compressed alone, and the watch handler ends one
// at every flush already. A GzipStream writes that series, except that a
// run of watch event frames that a Caching holds is sent as one member
// compressed once, by the first stream that sends the run, and then by
// every stream that sends the same frames in the same order: the initial
// events of watch-lists, which stream the same objects in key order.
//
// A member of each event alone would be simpler, and costs too much: gzip
// writes a Huffman table at every member's start, which a client must read,
// so that a member an event of 1 KiB took eleven times the bytes on the
// wire, and ten times the client's CPU, that events compressed together do.
//
// Runs must begin at the same frames in every stream, whatever each
// stream wrote before: a frame begins one if its address hashes to one of
// meanRun values (it is content-defined chunking, with the frame as the
// unit), and a run ends before the next such frame, or after maxRun frames.

const (
	meanRun = 64
	maxRun  = 512
)

// frames maps the address of each watch event's frame a Caching holds to
// its encoding, weakly: an encoding that expires is collected as before,
// and a cleanup then forgets it. The frame's bytes are never written after
// they are made, and no other live slice begins at their address, so a
// slice with that address and length is the frame.
var frames sync.Map // uintptr → weak.Pointer[encoding]

// frameKey is what the cleanup of an encoding forgets: its entry, unless a
// new frame took the address since.
type frameKey struct {
	addr uintptr
	e    weak.Pointer[encoding]
}

// run is a run of frames compressed as one gzip member.
type run struct {
	// frames are the run's frames; holding them keeps their addresses
	// theirs while the run lives, which is while its first frame's
	// encoding does.
	frames [][]byte
	member []byte
}

// register makes e's bytes known as a frame.
func (e *encoding) register() {
	if len(e.raw) == 0 {
		return
	}
	k := frameKey{addr: addressOf(e.raw), e: weak.Make(e)}
	frames.Store(k.addr, k.e)
	goruntime.AddCleanup(e, func(k frameKey) { frames.CompareAndDelete(k.addr, k.e) }, k)
}

func addressOf(p []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(p))) }

// frameOf returns the encoding whose frame p is, or nil.
func frameOf(p []byte) *encoding {
	if len(p) == 0 {
		return nil
	}
	v, ok := frames.Load(addressOf(p))
	if !ok {
		return nil
	}
	e := v.(weak.Pointer[encoding]).Value()
	if e == nil || !same(e.raw, p) {
		return nil
	}
	return e
}

// same tells whether a and b are the same bytes, not equal ones.
func same(a, b []byte) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// beginsRun tells the frames that begin a run.
func beginsRun(p []byte) bool {
	return (uint64(addressOf(p))*0x9E3779B97F4A7C15)>>58 == 0 // 1 in 64 = meanRun
}

// GzipStream writes a gzip stream of members to w, for one watch's
// response: what is written between two flushes is in members that end at
// the second, and runs of frames the cache holds are in members shared
// with every stream that sends them. Only one goroutine may use it.
type GzipStream struct {
	w io.Writer

	// gw is the member open for bytes of this stream's own, or nil.
	gw *gzip.Writer
	// pending are frames held back, from one that begins a run; first is
	// the encoding of the first.
	pending [][]byte
	first   *encoding
	// match is the run this stream's pending frames are the start of, as
	// another stream made it, or nil while they make a new one.
	match *run
}

// NewGzipStream returns a GzipStream writing to w.
func NewGzipStream(w io.Writer) *GzipStream { return &GzipStream{w: w} }

// gzipWriters are the writers GzipStreams compress with, at gzip.BestSpeed,
// the level of k8s.io/apiserver's responses.
var gzipWriters = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed) // a valid level: no error
	return w
}}

// Write implements io.Writer.
func (s *GzipStream) Write(p []byte) (int, error) {
	e := frameOf(p)
	if e == nil {
		if err := s.release(); err != nil {
			return 0, err
		}
		return s.own(p)
	}
	if len(s.pending) > 0 {
		switch {
		case beginsRun(p) || len(s.pending) == maxRun:
			if err := s.complete(); err != nil {
				return 0, err
			}
		case s.match != nil && (len(s.pending) == len(s.match.frames) || !same(s.match.frames[len(s.pending)], p)):
			// Not the run another stream made: this stream's own.
			if err := s.release(); err != nil {
				return 0, err
			}
			return s.own(p)
		default:
			s.pending = append(s.pending, p)
			return len(p), nil
		}
	}
	if !beginsRun(p) {
		return s.own(p)
	}
	s.pending, s.first, s.match = append(s.pending[:0], p), e, e.run.Load()
	return len(p), nil
}

// Flush ends the open member: a client then reads everything written.
func (s *GzipStream) Flush() error {
	if err := s.release(); err != nil {
		return err
	}
	return s.closeMember()
}

// Close ends the stream's last member.
func (s *GzipStream) Close() error { return s.Flush() }

// own writes p into the stream's own member.
func (s *GzipStream) own(p []byte) (int, error) {
	if s.gw == nil {
		s.gw = gzipWriters.Get().(*gzip.Writer)
		s.gw.Reset(s.w)
	}
	return s.gw.Write(p)
}

// release writes the pending frames into the stream's own member.
func (s *GzipStream) release() error {
	for _, p := range s.pending {
		if _, err := s.own(p); err != nil {
			return err
		}
	}
	s.clear()
	return nil
}

func (s *GzipStream) clear() {
	clear(s.pending) // no frames held past their send
	s.pending, s.first, s.match = s.pending[:0], nil, nil
}

// complete sends the pending frames, a whole run, as the run's member: the
// one another stream made for them, or one made now and kept for the next.
func (s *GzipStream) complete() error {
	r := s.match
	switch {
	case r != nil && len(r.frames) != len(s.pending):
		// Another run from the same frame: this stream's own.
		return s.release()
	case r == nil:
		r = &run{frames: append([][]byte(nil), s.pending...)}
		if r.member = gzipMember(r.frames); r.member == nil {
			return s.release()
		}
		s.first.run.CompareAndSwap(nil, r)
		runsMade.Add(1)
	}
	s.clear()
	if err := s.closeMember(); err != nil {
		return err
	}
	_, err := s.w.Write(r.member)
	return err
}

// closeMember ends the stream's own member, if one is open.
func (s *GzipStream) closeMember() error {
	if s.gw == nil {
		return nil
	}
	err := endMember(s.gw)
	s.gw.Reset(nil)
	gzipWriters.Put(s.gw)
	s.gw = nil
	return err
}

// endMember ends w's member. Its data ends in a flush, as the library's
// members do, before its last block: Go's gzip reader returns the data a
// member ends with only once it has read the next member's header, and the
// next event may be long in coming.
func endMember(w *gzip.Writer) error {
	if err := w.Flush(); err != nil {
		return err
	}
	return w.Close()
}

// gzipMember compresses frames as one gzip member, or returns nil if it
// cannot.
func gzipMember(frames [][]byte) []byte {
	var buf bytes.Buffer
	w := gzipWriters.Get().(*gzip.Writer)
	defer func() {
		w.Reset(nil) // the pool keeps no buffer
		gzipWriters.Put(w)
	}()
	w.Reset(&buf)
	for _, p := range frames {
		if _, err := w.Write(p); err != nil {
			return nil
		}
	}
	if endMember(w) != nil {
		return nil
	}
	return bytes.Clone(buf.Bytes())
}

// runsMade counts the runs compressed, for tests.
var runsMade atomic.Int64
