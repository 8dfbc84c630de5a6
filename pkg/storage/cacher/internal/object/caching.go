package object

import (
	"bytes"
	"io"
	"reflect"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Caching is a cached object as watchers are sent it: each encoding
// of it is computed once, however many watchers receive it. The generic
// HTTP handlers recognise runtime.CacheableObject and call CacheEncode with
// an identifier per (serializer, version, event type). An encoder that
// writes the object's bytes (Codec) gets them; any other encodes a
// copy decoded once, which the Caching keeps while it lives.
//
// Like objects from a client-go informer, it is shared and read-only: a
// consumer that wants to change it calls GetObject for a private copy. Its
// metadata is read through meta.Accessor (GetObjectMeta), which decodes.
type Caching struct {
	o *Object

	// slot, if set, is the cached object's reference to this one, which
	// expire clears.
	slot *atomic.Pointer[Caching]
	// used is when a sender last asked for o, in Unix nanoseconds, as
	// Expiry.touch records it.
	used atomic.Int64

	// decodeOnce makes decoded, the object decoded for the encoders that
	// need a Go object; it is shared by them and never mutated.
	decodeOnce sync.Once
	decoded    runtime.Object
	decodeErr  error

	// mu guards encodings.
	mu        sync.RWMutex
	encodings map[runtime.Identifier]*encoding

	// listRun is the run of lists' items the object's begins, compressed
	// once for every list (GzipStream.WriteItem), or nil.
	listRun atomic.Pointer[run]
}

// encoding is one serialized form, computed once.
type encoding struct {
	once sync.Once
	raw  []byte
	err  error

	// run is the run of frames that raw, a watch event's frame, begins,
	// compressed once for every watch-list (GzipStream), or nil.
	run atomic.Pointer[run]
}

var (
	_ runtime.CacheableObject   = &Caching{}
	_ metav1.ObjectMetaAccessor = &Caching{}
)

func NewCaching(o *Object) *Caching { return &Caching{o: o} }

// NewCachingOf is a Caching of o, whose bytes are obj's encoding: an object
// the cache made, not read from etcd, such as a bookmark. Encoders that
// need a Go object get obj, as upstream's do, not o's bytes decoded, which
// the decoder defaults. Decoded, a bookmark's empty object gained its
// defaults and no longer encoded as its bytes, and the encoder that first
// compared the two was learnt as one that does not write the bytes, for
// every object after it: where a bookmark was the first object a watch
// encoder met, every event was encoded again for each stream. obj is
// shared and read-only from then on.
func NewCachingOf(o *Object, obj runtime.Object) *Caching {
	co := &Caching{o: o}
	co.decodeOnce.Do(func() { co.decoded = obj })
	return co
}

// Caching returns o's Caching, making it if o has none: every sender
// until x's TTL passes unused shares one, and so one encoding per
// serializer. A nil x keeps it while o is current.
func (o *Object) Caching(x *Expiry) *Caching {
	for {
		if co := o.co.Load(); co != nil {
			if x != nil {
				x.touch(co)
			}
			return co
		}
		co := NewCaching(o)
		co.slot = &o.co
		if o.co.CompareAndSwap(nil, co) {
			if x != nil {
				x.add(co)
			}
			return co
		}
	}
}

// scratch holds the buffers encodings are written into before they are
// copied to their length. Each encoding of a watch-list's objects, a
// hundred thousand at a time, grew a buffer of its own: a tenth of what
// the server allocated while watch-lists started (docs/benchmarks.md).
var scratch = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxScratch is the largest buffer scratch keeps: an object that encodes
// larger is rare, and its buffer is not held for the next.
const maxScratch = 1 << 20

// encodable returns a copy of obj for an encoder, which may set the type
// meta of what it is given: the versioning codec sets it, and puts it back,
// on the object it converts. That is a copy of obj's top-level struct, which
// has a type meta of its own and shares everything below it, which encoders
// only read. An object whose kind is not held in its top-level struct
// (Unstructured keeps it in a map), or that nests objects an encoder
// rewrites, gets a deep copy.
func encodable(obj runtime.Object) runtime.Object {
	switch obj.(type) {
	case runtime.Unstructured, runtime.NestedObjectEncoder:
		return obj.DeepCopyObject()
	}
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return obj.DeepCopyObject()
	}
	c := reflect.New(v.Elem().Type())
	c.Elem().Set(v.Elem())
	cp := c.Interface().(runtime.Object)
	// The copy's kind must be its own: a pointer into the copy.
	if kind := cp.GetObjectKind(); kind == nil || !reflect.TypeOf(kind).Comparable() || kind == obj.GetObjectKind() {
		return obj.DeepCopyObject()
	}
	return cp
}

// CacheEncode implements runtime.CacheableObject.
func (co *Caching) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	kind := co.o.Codec.kind(id)
	switch kind {
	case encoderRaw:
		// Compressed, in an array of their own: the splicer holds them.
		raw, err := co.o.Bytes(nil)
		if err != nil {
			return err
		}
		if s, ok := w.(runtime.Splice); ok {
			// The watch handler's buffer for the embedded object: it can
			// hold the bytes, which never change, instead of a copy of its own.
			s.Splice(raw)
			return nil
		}
		_, err = w.Write(raw)
		return err
	case encoderWatchUncached:
		return encode(co, w)
	case encoderUncached:
		obj, err := co.object()
		if err != nil {
			return err
		}
		return encode(encodable(obj), w)
	}
	e := co.encoding(id)
	e.once.Do(func() {
		buf := scratch.Get().(*bytes.Buffer)
		buf.Reset()
		if kind == encoderWatch {
			e.err = co.encodeEvent(id, encode, buf)
		} else if obj, err := co.object(); err != nil {
			e.err = err
		} else if e.err = encode(encodable(obj), buf); e.err == nil && kind == encoderUnknown {
			co.o.Codec.compare(id, co.o, buf.Bytes())
		}
		// A copy of the length, without the buffer's spare capacity.
		e.raw = bytes.Clone(buf.Bytes())
		if kind == encoderWatch && e.err == nil {
			e.register()
		}
		if buf.Cap() <= maxScratch {
			scratch.Put(buf)
		}
	})
	if e.err != nil {
		return e.err
	}
	_, err := w.Write(e.raw)
	return err
}

// encodeEvent writes to buf the watch event the watch encoder id, whose
// encode is encode, writes for co.
func (co *Caching) encodeEvent(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, buf *bytes.Buffer) error {
	if start, ok := co.o.Codec.eventStart(id); ok {
		// What the encoder was seen to write (Codec.learnEvent), without
		// it: it encodes in the serving goroutine of the first watch sent
		// the event, which for a single-object watch is its only one, where
		// it grew the goroutine's stack, and two buffers the watch keeps
		// while it lasts, for every watch. A compressed object is
		// decompressed straight into the buffer.
		ev, err := appendEvent(buf.AvailableBuffer(), start, co.o)
		if err != nil {
			return err
		}
		buf.Write(ev)
		return nil
	}
	// The watch encoder encodes the object with its embedded encoder,
	// which comes back here with its own identifier.
	if err := encode(co, buf); err != nil {
		return err
	}
	co.o.Codec.learnEvent(id, co.o, buf.Bytes())
	return nil
}

// object returns the decoded object the encoders share.
func (co *Caching) object() (runtime.Object, error) {
	co.decodeOnce.Do(func() { co.decoded, co.decodeErr = co.o.Decode() })
	return co.decoded, co.decodeErr
}

func (co *Caching) encoding(id runtime.Identifier) *encoding {
	co.mu.RLock()
	e, ok := co.encodings[id]
	co.mu.RUnlock()
	if ok {
		return e
	}
	co.mu.Lock()
	if e, ok = co.encodings[id]; !ok {
		if co.encodings == nil {
			co.encodings = map[runtime.Identifier]*encoding{}
		}
		e = &encoding{}
		co.encodings[id] = e
	}
	co.mu.Unlock()
	return e
}

// expire forgets every encoding, and detaches co from its cached object, so
// that the next sender makes a new one. An encoding in progress completes
// for its callers; a sender that still holds co encodes again.
func (co *Caching) expire() {
	co.mu.Lock()
	co.encodings = nil
	co.mu.Unlock()
	if co.slot != nil {
		co.slot.CompareAndSwap(co, nil)
	}
}

// GetObject implements runtime.CacheableObject: the caller owns the copy.
// An object that cannot be decoded, which ingest never keeps, is nil.
func (co *Caching) GetObject() runtime.Object { return co.o.DeepCopyObject() }

// GetObjectMeta implements metav1.ObjectMetaAccessor, read-only.
func (co *Caching) GetObjectMeta() metav1.Object {
	obj, _ := co.object()
	return metadataOf(obj)
}

// GetObjectKind implements runtime.Object. A cached object's kind is not
// held (object.GetObjectKind).
func (co *Caching) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object: a Caching of the same
// cached object, whose encodings and decoded copy are its own.
func (co *Caching) DeepCopyObject() runtime.Object { return NewCaching(co.o) }

// Cached returns the cached object co sends.
func (co *Caching) Cached() *Object { return co.o }
