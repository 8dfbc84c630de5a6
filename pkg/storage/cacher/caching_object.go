package cacher

import (
	"bytes"
	"io"
	"reflect"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// cachingObject wraps an immutable object so that each encoding of it is
// computed once, however many watchers receive it. The generic HTTP handlers
// recognise runtime.CacheableObject and call CacheEncode with an identifier
// per (serializer, version, event type).
//
// It also implements metav1.Object by delegation, so that consumers can read
// metadata without unwrapping. Like objects from a client-go informer, it is
// shared and read-only: a consumer that wants to change it calls GetObject
// for a private copy.
type cachingObject struct {
	metav1.Object
	// obj is shared by every reader and never mutated.
	obj runtime.Object

	// slot, if set, is the cached object's reference to this one, which
	// expire clears.
	slot *atomic.Pointer[cachingObject]
	// used is when a sender last asked for o, in Unix nanoseconds, as
	// encodingExpiry.touch records it.
	used atomic.Int64

	// mu guards encodings.
	mu        sync.RWMutex
	encodings map[runtime.Identifier]*encoding
}

// encoding is one serialized form, computed once.
type encoding struct {
	once sync.Once
	raw  []byte
	err  error
}

var _ runtime.CacheableObject = &cachingObject{}

// newCachingObject wraps obj, which must have object metadata.
func newCachingObject(obj runtime.Object) *cachingObject {
	m, err := meta.Accessor(obj)
	if err != nil {
		// Storage only holds objects with metadata; etcd3 could not have decoded it otherwise.
		m = &metav1.ObjectMeta{}
	}
	return &cachingObject{Object: m, obj: obj}
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
// only read; a deep copy of every object a watch-list encoded was another
// tenth of the server's allocations. An object whose kind is not held in
// its top-level struct (Unstructured keeps it in a map), or that nests
// objects an encoder rewrites, gets a deep copy.
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
func (o *cachingObject) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	e := o.encoding(id)
	e.once.Do(func() {
		buf := scratch.Get().(*bytes.Buffer)
		buf.Reset()
		e.err = encode(encodable(o.obj), buf)
		// A copy of the length, without the buffer's spare capacity.
		e.raw = bytes.Clone(buf.Bytes())
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

func (o *cachingObject) encoding(id runtime.Identifier) *encoding {
	o.mu.RLock()
	e, ok := o.encodings[id]
	o.mu.RUnlock()
	if ok {
		return e
	}
	o.mu.Lock()
	if e, ok = o.encodings[id]; !ok {
		if o.encodings == nil {
			o.encodings = map[runtime.Identifier]*encoding{}
		}
		e = &encoding{}
		o.encodings[id] = e
	}
	o.mu.Unlock()
	return e
}

// expire forgets every encoding, and detaches o from its cached object, so
// that the next sender makes a new one. An encoding in progress completes
// for its callers; a sender that still holds o encodes again.
func (o *cachingObject) expire() {
	o.mu.Lock()
	o.encodings = nil
	o.mu.Unlock()
	if o.slot != nil {
		o.slot.CompareAndSwap(o, nil)
	}
}

// GetObject implements runtime.CacheableObject: the caller owns the copy.
func (o *cachingObject) GetObject() runtime.Object { return o.obj.DeepCopyObject() }

// GetObjectKind implements runtime.Object. It returns the kind of the
// wrapped object without letting the caller change it.
func (o *cachingObject) GetObjectKind() schema.ObjectKind {
	return readOnlyKind{o.obj.GetObjectKind()}
}

// DeepCopyObject implements runtime.Object.
func (o *cachingObject) DeepCopyObject() runtime.Object {
	return newCachingObject(o.obj.DeepCopyObject())
}

// readOnlyKind ignores writes, so that a shared object's type meta cannot change.
type readOnlyKind struct{ schema.ObjectKind }

func (readOnlyKind) SetGroupVersionKind(schema.GroupVersionKind) {}
