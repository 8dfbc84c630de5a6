package object

import (
	"bytes"
	"errors"
	"hash/crc32"
	"hash/maphash"
	"io"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/klauspost/compress/flate"
)

// Runs must begin at the same frames in every stream, whatever each
// stream wrote before: a frame begins one if its sum hashes to one of
// meanRun values (content-defined chunking, with the frame as the unit),
// and a run ends before the next such frame, or after maxRun frames. The
// run kept from a frame is the latest: a stream that sends other frames
// after it, as objects change, makes a run that replaces it.
//
// A watch event's frame is known by its bytes: a stream sends a run only if
// its frames are equal, byte for byte, to those the run was compressed
// from, so that a run can never stand for other bytes, whatever the memory
// they lie in held before. The frames are nearly always the very bytes the
// run holds, which bytes.Equal compares in constant time.
//
// A list's item is known by its object version, the *Object the run holds,
// never by bytes: a compressed object's bytes are decompressed anew for
// each stream that writes them (Object.AppendItem), into memory that
// another stream reuses, so that no run may hold them. An object's bytes
// never change, compressed or not, and the run keeps the object, so that
// its address names no other while the run lives.

const (
	meanRun = 64
	maxRun  = 512
)

// frames maps the sum of each watch event's frame a Caching holds to its
// encoding, weakly: an encoding that expires is collected as before, and a
// cleanup then forgets it. Two frames with one sum share an entry, the
// latest's: the other is then not known, and is sent as a stream's own.
var frames sync.Map // uint64 → weak.Pointer[encoding]

// seed keys the sums.
var seed = maphash.MakeSeed()

// frameSum is the sum of a watch event's frame: of its bytes.
func frameSum(p []byte) uint64 { return maphash.Bytes(seed, p) }

// itemSum is the sum of o's bytes as a list's item: of its key and
// resourceVersion, which name those bytes, without reading them.
func itemSum(o *Object) uint64 { return maphash.String(seed, o.Key) ^ o.RV*0x9E3779B97F4A7C15 }

// frameKey is what the cleanup of an encoding forgets: its entry, unless
// another frame with the same sum took it since.
type frameKey struct {
	sum uint64
	e   weak.Pointer[encoding]
}

// piece is a frame as a stream sends it: after prefix, which is a list's
// separator, or nil; sum decides whether it begins a run. A list's item
// is its object, item, whose bytes are read when they are written, and
// frame is nil.
type piece struct {
	prefix, frame []byte
	item          *Object
	sum           uint64
}

// is tells whether q is p: the same object version, or equal frames, after
// equal prefixes.
func (p piece) is(q piece) bool {
	if p.item != nil || q.item != nil {
		return p.item == q.item && bytes.Equal(p.prefix, q.prefix)
	}
	return bytes.Equal(p.frame, q.frame) && bytes.Equal(p.prefix, q.prefix)
}

// write writes the piece's prefix and frame to w, an item's bytes read
// into buf, which it returns grown, and adds what it wrote to sum.
func (p piece) write(w io.Writer, buf []byte, sum func([]byte)) ([]byte, error) {
	frame := p.frame
	if p.item != nil {
		var err error
		if buf, err = p.item.AppendItem(buf[:0]); err != nil {
			return buf, err
		}
		frame = buf
	}
	for _, b := range [][]byte{p.prefix, frame} {
		if _, err := w.Write(b); err != nil {
			return buf, err
		}
		sum(b)
	}
	return buf, nil
}

// beginsRun tells the pieces that begin a run.
func (p piece) beginsRun() bool { return p.sum>>58 == 0 } // 1 in 64 = meanRun

// run is a run of frames compressed as one deflate segment.
type run struct {
	pieces   []piece
	deflated []byte
	// crc and size are the CRC-32 and length of what the pieces hold.
	crc  uint32
	size int
}

// register makes e's bytes known as a frame.
func (e *encoding) register() {
	if len(e.raw) == 0 {
		return
	}
	k := frameKey{sum: frameSum(e.raw), e: weak.Make(e)}
	frames.Store(k.sum, k.e)
	goruntime.AddCleanup(e, func(k frameKey) { frames.CompareAndDelete(k.sum, k.e) }, k)
}

// frameOf returns the encoding whose frame p is equal to, and p's sum, or
// nil.
func frameOf(p []byte) (*encoding, uint64) {
	if len(p) == 0 {
		return nil, 0
	}
	sum := frameSum(p)
	v, ok := frames.Load(sum)
	if !ok {
		return nil, 0
	}
	e := v.(weak.Pointer[encoding]).Value()
	if e == nil || !bytes.Equal(e.raw, p) {
		return nil, 0
	}
	return e, sum
}

// deflate compresses the run's pieces as one segment, which ends in a
// sync flush, and sums them, reading items' bytes into scratch, which it
// returns grown; deflated stays nil if it cannot, and err is a corrupt
// item's.
func (r *run) deflate(scratch []byte) (_ []byte, err error) {
	var buf bytes.Buffer
	w := flateWriters.Get().(*flate.Writer)
	defer func() {
		w.Reset(io.Discard) // the pool keeps no buffer
		flateWriters.Put(w)
	}()
	w.Reset(&buf)
	sum := func(p []byte) {
		r.crc = crc32.Update(r.crc, crc32.IEEETable, p)
		r.size += len(p)
	}
	for _, pc := range r.pieces {
		if scratch, err = pc.write(w, scratch, sum); err != nil {
			if errors.Is(err, ErrCorrupt) {
				return scratch, err
			}
			return scratch, nil
		}
	}
	if w.Flush() != nil {
		return scratch, nil
	}
	r.deflated = bytes.Clone(buf.Bytes())
	return scratch, nil
}

// runsMade and runsShared count the runs compressed, and those sent as
// another stream compressed them.
var runsMade, runsShared atomic.Int64

// RunsCompressed returns how many runs of frames GzipStreams compressed,
// and how many they sent as another stream had compressed them.
func RunsCompressed() (made, shared int64) { return runsMade.Load(), runsShared.Load() }
