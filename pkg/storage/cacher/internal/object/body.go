package object

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/compress"
)

// body is an object's bytes as a cache that compresses them keeps them
// (BuilderConfig.Compression): as they are, or as a compress record. It
// is immutable; Pack replaces an object's body whole.
type body struct {
	// b is the object's bytes, or, when dict is set, a record of them.
	b []byte
	// dict is the dictionary the record needs (compress.CompressTo), which
	// the body holds so that a record never outlives it; nil while b is
	// the bytes themselves.
	dict *compress.Dictionary
}

// sizeNewline marks, in Object.size, bytes that end in a newline, as the
// JSON serializer's do: a list's item leaves it out (ListItem), and a
// compressed object's last byte is not known without decompressing it.
const sizeNewline = 1 << 31

// maxBodySize is the longest object a body holds: what Object.size's other
// bits count, far above etcd's largest value and compress.DefaultMaxSize.
const maxBodySize = sizeNewline - 1

// ErrCorrupt is what reading a compressed object returns when its record
// does not decompress to the bytes it was made from (compress.ErrCorrupt):
// the bytes are never returned, and the cache is told (BuilderConfig.Corrupt).
var ErrCorrupt = compress.ErrCorrupt

// setBody makes raw the object's bytes, kept as they are in a body that
// Pack may compress later. Only a builder calls it, before anyone else
// holds the object.
func (o *Object) setBody(raw []byte) error {
	if len(raw) > maxBodySize {
		return fmt.Errorf("%d bytes, more than the %d a compressed cache keeps", len(raw), maxBodySize)
	}
	o.size = uint32(len(raw))
	if bytes.HasSuffix(raw, []byte("\n")) {
		o.size |= sizeNewline
	}
	o.body.Store(&body{b: raw})
	return nil
}

// Bytes returns the object's bytes, the one way to read them: the bytes
// the object holds, when it holds them as they are, which the caller must
// not change; or else the bytes decompressed into buf's capacity from its
// start, or into a new array when buf is too small. A caller that keeps
// them past buf's reuse, or hands them to a decoder that shares the
// strings it decodes with its input (decodeExact), passes nil for a new
// array: on the bytes the object holds the decoder shares them.
//
// A compressed object that does not decompress to the bytes it was made
// from is never returned: Bytes returns ErrCorrupt, and tells the cache
// (BuilderConfig.Corrupt), which lists again.
func (o *Object) Bytes(buf []byte) ([]byte, error) {
	b := o.body.Load()
	switch {
	case b == nil:
		return o.Raw, nil
	case b.dict == nil:
		return b.b, nil
	}
	out, err := o.Codec.compression.DecompressWith(buf[:0], b.b, b.dict)
	switch {
	case err == nil && len(out) != o.Len():
		err = fmt.Errorf("%w: %d bytes, not %d", compress.ErrCorrupt, len(out), o.Len())
	case err != nil && !errors.Is(err, compress.ErrCorrupt):
		// A record that names another dictionary than the one it was
		// kept with (ErrUnknownDictionary) is as corrupt.
		err = fmt.Errorf("%w: %w", compress.ErrCorrupt, err)
	}
	if err != nil {
		err = fmt.Errorf("reading the cached %s at %d: %w", o.Key, o.RV, err)
		o.Codec.corrupted(o, err)
		return nil, err
	}
	return out, nil
}

// AppendBytes appends the object's bytes to dst (Bytes), decompressed in
// place when they are compressed and dst has room.
func (o *Object) AppendBytes(dst []byte) ([]byte, error) {
	b, err := o.Bytes(dst[len(dst):])
	if err != nil {
		return dst, err
	}
	// Where b was decompressed into dst's room, this copies it onto itself.
	return append(dst, b...), nil
}

// Len is the length of the object's bytes, however they are kept: what
// the history's budget and gauge, Stats and list sizes count, so that no
// compressed size is ever seen outside the process (docs/architecture.md,
// "Objects compressed at rest").
func (o *Object) Len() int {
	if o.body.Load() == nil {
		return len(o.Raw)
	}
	return int(o.size &^ sizeNewline)
}

// endsInNewline reports whether the object's bytes end in a newline.
func (o *Object) endsInNewline() bool {
	if o.body.Load() == nil {
		return bytes.HasSuffix(o.Raw, []byte("\n"))
	}
	return o.size&sizeNewline != 0
}

// Packing is how an object's bytes are kept, for the packer.
type Packing struct {
	// Packable is whether the cache may compress the object: it keeps it
	// in a body (BuilderConfig.Compression). The objects the cache makes
	// itself, bookmarks and objects At a later resourceVersion, are not.
	Packable bool
	// Dict is the dictionary the object's record needs, nil while its
	// bytes are kept as they are; the Codec's empty one (id 0) for a record
	// that holds them as they are, because they did not compress.
	Dict *compress.Dictionary
	// Record is the length of the record, 0 while there is none.
	Record int
}

// Packing returns how the object's bytes are kept.
func (o *Object) Packing() Packing {
	b := o.body.Load()
	if b == nil {
		return Packing{}
	}
	if b.dict == nil {
		return Packing{Packable: true}
	}
	return Packing{Packable: true, Dict: b.dict, Record: len(b.b)}
}

// Record returns the record that holds the object's bytes compressed, nil
// while they are kept as they are. It is the object's own: read-only, but
// for a test that damages it to see the damage caught.
func (o *Object) Record() []byte {
	if b := o.body.Load(); b != nil && b.dict != nil {
		return b.b
	}
	return nil
}

// errNotPackable is Pack's error for an object the cache keeps in Raw.
var errNotPackable = errors.New("the object's bytes are not kept in a body")

// Scratch is the room Pack compresses and reads back in, which it grows
// and reuses from one object to the next.
type Scratch struct {
	plain, rec, check []byte
}

// Pack compresses the object's bytes against the current dictionary of
// the cache's codec and puts the record in place of what held them, for
// every holder of the object at once: its bytes are then read through
// the record (Bytes). The record is a copy of its own length. It is read
// back before it replaces anything: one that would not decompress to the
// same bytes is an error, and the object stays as it was.
//
// Only the packer calls it, one object at a time: two calls at once on
// one object would compress it twice, and keep one.
func (o *Object) Pack(s *Scratch) error {
	old := o.body.Load()
	if old == nil {
		return errNotPackable
	}
	c := o.Codec.compression
	raw := old.b
	if old.dict != nil {
		var err error
		if raw, err = o.Bytes(s.plain); err != nil {
			return err
		}
		s.plain = raw
	}
	rec, d := c.CompressTo(s.rec[:0], raw)
	s.rec = rec
	check, err := c.DecompressWith(s.check[:0], rec, d)
	s.check = check
	if err != nil || !bytes.Equal(check, raw) {
		return fmt.Errorf("compressing the cached %s at %d read back other bytes: %v", o.Key, o.RV, err)
	}
	o.body.CompareAndSwap(old, &body{b: bytes.Clone(rec), dict: d})
	return nil
}
