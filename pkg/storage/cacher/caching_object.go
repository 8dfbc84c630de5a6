package cacher

import (
	"bytes"
	"io"
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

// CacheEncode implements runtime.CacheableObject.
func (o *cachingObject) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	e := o.encoding(id)
	e.once.Do(func() {
		var buf bytes.Buffer
		// encode owns what it is given; it may set the type meta.
		e.err = encode(o.obj.DeepCopyObject(), &buf)
		// The buffer's spare capacity, up to its size again, would be kept too.
		e.raw = bytes.Clone(buf.Bytes())
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
