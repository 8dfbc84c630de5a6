package registry

import (
	"bytes"
	"fmt"
	"io"
	"reflect"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// sharedListChunk is how many items are copied and encoded at a time. A
// list holds copies of at most this many items, and each write to the
// response holds this many: about 40 KiB of 1 KiB objects.
const sharedListChunk = 32

// sharedList is a List response whose items are the watch cache's own
// objects, shared with every other reader and never changed.
//
// Upstream's cache copies every item into the response's list type, and
// the response holds those copies until it is written: 330 bytes an
// Assignment, 33 MB for a list of 100,000, for each list being written.
// This one holds 16 bytes an item. Its compact JSON, what clients ask
// for, is written sharedListChunk items at a time, each chunk copied into
// the resource's list type and encoded by the request's own encoder: the
// bytes are those of the list type's encoding. Any other encoding (YAML,
// pretty-printed JSON, CBOR) is of a full copy, as upstream's.
//
// Table and PartialObjectMetadataList responses read Items through meta's
// list helpers, which take []runtime.Object as they take []T.
type sharedList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object

	// newList returns an empty list of the resource's list type.
	newList func() runtime.Object
}

var _ runtime.CacheableObject = &sharedList{}

// itemsKey opens a list's items in compact JSON. It cannot occur inside a
// JSON string, whose quotes are escaped, so its first occurrence in a
// list is the list's own.
var itemsKey = []byte(`"items":[`)

// listEnd closes a list's items and the list, in compact JSON.
var listEnd = []byte("]}\n")

// CacheEncode implements runtime.CacheableObject. It caches nothing: it
// is the one place the apiserver lets a response choose how it is written.
func (l *sharedList) CacheEncode(_ runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	// The list with no items tells what the encoder writes: compact JSON
	// ends in "items":[]}, whatever else it holds.
	head, err := l.copyOf(nil)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := encode(head, &buf); err != nil {
		return err
	}
	open, ok := bytes.CutSuffix(buf.Bytes(), listEnd)
	if !ok || !bytes.HasPrefix(open, []byte(`{"`)) || !bytes.HasSuffix(open, itemsKey) {
		full, err := l.copyOf(l.Items)
		if err != nil {
			return err
		}
		return encode(full, w)
	}
	// The response writer takes a first write of at most 4 bytes for a
	// stream and gathers what follows to choose gzip, as it does for the
	// streaming encoders; a longer first write it sends uncompressed.
	if _, err := w.Write(open[:1]); err != nil {
		return err
	}
	if _, err := w.Write(open[1:]); err != nil {
		return err
	}
	chunk := l.newList()
	items, err := itemsOf(chunk)
	if err != nil {
		return err
	}
	room := reflect.MakeSlice(items.Type(), sharedListChunk, sharedListChunk)
	for start := 0; start < len(l.Items); start += sharedListChunk {
		part := l.Items[start:min(start+sharedListChunk, len(l.Items))]
		s := room.Slice(0, len(part))
		for i, o := range part {
			s.Index(i).Set(reflect.ValueOf(o).Elem())
		}
		items.Set(s)
		buf.Reset()
		if err := encode(chunk, &buf); err != nil {
			return err
		}
		out := buf.Bytes()
		at := bytes.Index(out, itemsKey)
		if at < 0 {
			return fmt.Errorf("encoding items %d to %d of a list: no items in %.100q", start, start+len(part), out)
		}
		body, ok := bytes.CutSuffix(out[at+len(itemsKey):], listEnd)
		if !ok {
			return fmt.Errorf("encoding items %d to %d of a list: unexpected end in %.100q", start, start+len(part), out)
		}
		if start > 0 {
			if _, err := w.Write([]byte{','}); err != nil {
				return err
			}
		}
		if _, err := w.Write(body); err != nil {
			return err
		}
	}
	_, err = w.Write(listEnd)
	return err
}

// GetObject implements runtime.CacheableObject: a copy in the resource's
// list type, which the caller owns the top level of.
func (l *sharedList) GetObject() runtime.Object {
	out, err := l.copyOf(l.Items)
	if err != nil {
		// newList's items are of the cached objects' type, so this is a
		// bug; the caller still gets every item.
		utilruntime.HandleError(fmt.Errorf("copying a shared list: %w", err))
		return l.DeepCopyObject()
	}
	return out
}

// copyOf returns a list of the resource's type with l's metadata and
// copies of items, which are empty but not nil when there are none, as a
// list from storage has them.
func (l *sharedList) copyOf(items []runtime.Object) (runtime.Object, error) {
	out := l.newList()
	if items == nil {
		items = []runtime.Object{}
	}
	if err := meta.SetList(out, items); err != nil {
		return nil, err
	}
	return out, setListMeta(out, &l.ListMeta)
}

// DeepCopyObject implements runtime.Object.
func (l *sharedList) DeepCopyObject() runtime.Object {
	out := &sharedList{TypeMeta: l.TypeMeta, newList: l.newList}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]runtime.Object, len(l.Items))
		for i, o := range l.Items {
			out.Items[i] = o.DeepCopyObject()
		}
	}
	return out
}

// itemsOf returns the settable Items of list.
func itemsOf(list runtime.Object) (reflect.Value, error) {
	ptr, err := meta.GetItemsPtr(list)
	if err != nil {
		return reflect.Value{}, err
	}
	return reflect.ValueOf(ptr).Elem(), nil
}
