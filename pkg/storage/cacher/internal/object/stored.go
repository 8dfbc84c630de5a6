package object

import (
	"bytes"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// StoredList is a list the etcd3 store fills with what it read and the
// bytes it decoded that from, when its codec is NewStorageCodec's: the
// cache's own lists, so that Build writes each object's bytes from the
// bytes etcd held instead of encoding the object again (spliceRV).
//
// The store decodes each item into a new one of the list's item type,
// with the bytes it read: NewStorageCodec's Decode recognizes a
// *StoredItem, and no other codec does, so only a store that decodes
// with NewStorageCodec may be given a StoredList.
type StoredList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []StoredItem
}

// NewStoredList returns an empty StoredList.
func NewStoredList() runtime.Object { return &StoredList{} }

// DeepCopyObject implements runtime.Object. The items' objects and bytes
// are shared, as nothing changes them.
func (l *StoredList) DeepCopyObject() runtime.Object {
	c := *l
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	c.Items = append([]StoredItem(nil), l.Items...)
	return &c
}

// StoredItem is one object of a StoredList.
type StoredItem struct {
	// Obj is the object decoded, with its resourceVersion set.
	Obj runtime.Object
	// Stored is what the storage's codec writes for Obj without its
	// resourceVersion, as the store decoded it from, or nil if it is not
	// known to be.
	Stored []byte
}

// GetObjectKind implements runtime.Object.
func (s *StoredItem) GetObjectKind() schema.ObjectKind {
	if s.Obj == nil {
		return schema.EmptyObjectKind
	}
	return s.Obj.GetObjectKind()
}

// DeepCopyObject implements runtime.Object.
func (s *StoredItem) DeepCopyObject() runtime.Object {
	c := &StoredItem{Stored: s.Stored}
	if s.Obj != nil {
		c.Obj = s.Obj.DeepCopyObject()
	}
	return c
}

// GetObjectMeta is Obj's metadata, which the store sets the
// resourceVersion of through it.
func (s *StoredItem) GetObjectMeta() metav1.Object {
	if s.Obj == nil {
		return nil
	}
	m, err := meta.Accessor(s.Obj)
	if err != nil {
		return nil
	}
	return m
}

// unwrap returns obj's decoded object and its stored bytes, if obj is a
// *StoredItem, or obj and nil.
func unwrap(obj runtime.Object) (runtime.Object, []byte) {
	if s, ok := obj.(*StoredItem); ok {
		return s.Obj, s.Stored
	}
	return obj, nil
}

// metaBeforeRV are the keys encoding/json writes before resourceVersion
// in an ObjectMeta, in its fields' order; each holds a string.
var metaBeforeRV = [][]byte{[]byte(`"name":`), []byte(`"generateName":`), []byte(`"namespace":`), []byte(`"selfLink":`), []byte(`"uid":`)}

// spliceRV returns stored with `"resourceVersion":"rv"` where
// encoding/json writes it in the object's metadata, in a new array, and
// whether it could: stored must be what the
// JSON serializer writes for a typed object without a resourceVersion,
// whose type header is followed by its metadata, an ObjectMeta. Anything
// else (no such header, metadata elsewhere, a resourceVersion already, an
// escape in the keys before it) returns false, and the caller encodes.
//
// The slice it returns has room for that many bytes more in its capacity.
func spliceRV(stored []byte, rv string, room int) ([]byte, bool) {
	n := int(TypeHeader(stored))
	if n == 0 || rv == "" || strings.Trim(rv, "0123456789") != "" {
		return nil, false
	}
	rest, ok := bytes.CutPrefix(stored[n:], []byte(`"metadata":{`))
	if !ok {
		return nil, false
	}
	first := true
	for _, key := range metaBeforeRV {
		after := rest
		if !first {
			if after, ok = bytes.CutPrefix(rest, []byte{','}); !ok {
				break
			}
		}
		if after, ok = bytes.CutPrefix(after, key); !ok {
			continue
		}
		value, ok := bytes.CutPrefix(after, []byte{'"'})
		if !ok {
			return nil, false
		}
		if _, rest, ok = cutString(value); !ok {
			return nil, false
		}
		first = false
	}
	if len(rest) == 0 || bytes.HasPrefix(bytes.TrimPrefix(rest, []byte{','}), []byte(`"resourceVersion":`)) {
		return nil, false
	}
	field := `"resourceVersion":"` + rv + `"`
	switch {
	case !first:
		// After the keys before it, ahead of the comma or brace after them.
		field = "," + field
	case rest[0] != '}':
		// The first key, ahead of the next one.
		field += ","
	}
	at := len(stored) - len(rest)
	out := make([]byte, 0, len(stored)+len(field)+room)
	out = append(out, stored[:at]...)
	out = append(out, field...)
	return append(out, stored[at:]...), true
}
