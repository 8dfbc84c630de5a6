package registry

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// sharedListChunk is how many items that must be encoded are copied and
// encoded at a time: about 40 KiB of 1 KiB objects.
const sharedListChunk = 32

// sharedListFlush is how many bytes of items are gathered before they are
// written to the response.
const sharedListFlush = 64 << 10

// sharedList is a List response whose items are the watch cache's own
// objects, shared with every other reader and never changed.
//
// Upstream's cache copies every item into the response's list type, and
// the response holds those copies until it is written: 330 bytes an
// Assignment, 33 MB for a list of 100,000, for each list being written.
// This one holds 16 bytes an item. The cache keeps each object as the
// bytes of its compact JSON at the storage version, and in that encoding
// and version the items are those bytes (listItem), with no encoding at
// all. Any other item is copied, sharedListChunk at a time, into the
// resource's list type and encoded by the request's own encoder. Any other
// encoding of the list (YAML, pretty-printed JSON, CBOR) is of a full
// decoded copy, as upstream's.
//
// Table and PartialObjectMetadataList responses convert GetObject's copy.
type sharedList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object

	// newList returns an empty list of the resource's list type.
	newList func() runtime.Object
	// gzip, if set, is the response this list may write compressed itself.
	gzip *GzipResponse
}

var _ runtime.CacheableObject = &sharedList{}

// listItem is an item that gives its bytes to a list: the watch cache's
// objects (cacher.SharingList). ListItem tells whether the item's bytes are
// what the encoder writes for it as a list's item, and if so, the item is
// open followed by the n bytes AppendItem appends: the bytes are read, and
// decompressed if the cache keeps them compressed, only when written, and
// straight into the response's buffer.
type listItem interface {
	ListItem(id runtime.Identifier, encode func(runtime.Object, io.Writer) error) (open []byte, n int, ok bool)
	AppendItem(dst []byte) ([]byte, error)
}

// itemsKey opens a list's items in compact JSON. It cannot occur inside a
// JSON string, whose quotes are escaped, so its first occurrence in a
// list is the list's own.
var itemsKey = []byte(`"items":[`)

// listEnd closes a list's items and the list, in compact JSON.
var listEnd = []byte("]}\n")

// CacheEncode implements runtime.CacheableObject. It caches nothing: it
// is the one place the apiserver lets a response choose how it is written.
func (l *sharedList) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
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
	if done, err := l.writeGzip(id, encode, open, w); done {
		return err
	}
	// The response writer takes a first write of at most 4 bytes for a
	// stream and gathers what follows to choose gzip, as it does for the
	// streaming encoders; a longer first write it sends uncompressed.
	if _, err := w.Write(open[:1]); err != nil {
		return err
	}
	iw := &itemWriter{w: w, encode: encode, newList: l.newList}
	iw.out.Grow(sharedListFlush)
	iw.out.Write(open[1:])
	for _, o := range l.Items {
		if err := iw.add(id, o); err != nil {
			return err
		}
	}
	if err := iw.flushChunk(); err != nil {
		return err
	}
	iw.out.Write(listEnd)
	return iw.flush()
}

// gzipThreshold is the size above which k8s.io/apiserver compresses a
// response (responsewriters' defaultGzipThresholdBytes).
const gzipThreshold = 128 << 10

// commaBrace separates a list's items that ListItem opens with a brace.
var commaBrace = []byte(",{")

// writeGzip writes the list compressed to w, the library's writer, as the
// library would for the request, if every item is the cache's bytes for
// this encoder and the list is larger than the library's threshold; done
// is false if it wrote nothing, and the caller writes the list. Runs of
// items are compressed once for every list that sends them
// (GzipItemStream).
//
// The stream writes through w, so that the library sends the status and
// the Content-Type, and its request metrics count the response as any
// other: w compresses only when its first write is larger than the
// threshold, and the stream's first write is the 10 bytes of a gzip
// header, which it passes on as they are, and everything after them.
// Content-Encoding is set first in the response's headers, which w sends.
func (l *sharedList) writeGzip(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, head []byte, w io.Writer) (done bool, err error) {
	if l.gzip == nil {
		return false, nil
	}
	size := len(head) + len(listEnd)
	for _, o := range l.Items {
		li, ok := o.(listItem)
		if !ok {
			return false, nil
		}
		open, n, ok := li.ListItem(id, encode)
		if !ok {
			return false, nil
		}
		size += 1 + len(open) + n
	}
	if size <= gzipThreshold {
		return false, nil
	}
	l.gzip.Header.Set("Content-Encoding", "gzip")
	l.gzip.Header.Add("Vary", "Accept-Encoding")
	if err := l.writeItems(l.gzip.NewStream(w), id, encode, head); err != nil {
		// The status is sent with the stream's first write: an error now
		// would be written after the items, into the stream. The client
		// reads a stream cut short.
		utilruntime.HandleError(fmt.Errorf("writing a compressed list of %d items: %w", len(l.Items), err))
	}
	return true, nil
}

// writeItems writes the list to s, its head first.
func (l *sharedList) writeItems(s GzipItemStream, id runtime.Identifier, encode func(runtime.Object, io.Writer) error, head []byte) error {
	if _, err := s.Write(head); err != nil {
		return err
	}
	for i, o := range l.Items {
		open, _, _ := o.(listItem).ListItem(id, encode) // each gave its bytes to writeGzip
		prefix := open
		switch {
		case i == 0:
		case bytes.Equal(open, commaBrace[1:]):
			prefix = commaBrace
		default:
			prefix = append([]byte{','}, open...)
		}
		if err := s.WriteItem(prefix, o); err != nil {
			return err
		}
	}
	if _, err := s.Write(listEnd); err != nil {
		return err
	}
	return s.Close()
}

// itemWriter writes a shared list's items: the bytes of those that have
// them, and the encoding of chunks of copies of the others.
type itemWriter struct {
	w       io.Writer
	encode  func(runtime.Object, io.Writer) error
	newList func() runtime.Object
	// out gathers what is to be written; buf is where chunks are encoded.
	out, buf bytes.Buffer
	// chunk holds the copies not yet encoded.
	chunk []runtime.Object
	// written counts the items in out or written.
	written int
}

func (iw *itemWriter) add(id runtime.Identifier, o runtime.Object) error {
	if li, ok := o.(listItem); ok {
		if open, n, ok := li.ListItem(id, iw.encode); ok {
			if err := iw.flushChunk(); err != nil {
				return err
			}
			iw.comma()
			iw.out.Write(open)
			iw.out.Grow(n)
			item, err := li.AppendItem(iw.out.AvailableBuffer())
			if err != nil {
				return err
			}
			iw.out.Write(item)
			return iw.flushIfFull()
		}
		// Its DeepCopyObject is a decoded copy, nil for an item the cache
		// could not read (a corrupt one: it lists again).
		if o = o.DeepCopyObject(); o == nil {
			return errUnreadableItem
		}
	}
	iw.chunk = append(iw.chunk, o)
	if len(iw.chunk) == sharedListChunk {
		return iw.flushChunk()
	}
	return nil
}

func (iw *itemWriter) comma() {
	if iw.written > 0 {
		iw.out.WriteByte(',')
	}
	iw.written++
}

// flushChunk encodes the copies gathered as items of a list, and adds
// them to out.
func (iw *itemWriter) flushChunk() error {
	if len(iw.chunk) == 0 {
		return nil
	}
	defer func() { iw.chunk = iw.chunk[:0] }()
	list := iw.newList()
	if err := meta.SetList(list, iw.chunk); err != nil {
		return err
	}
	iw.buf.Reset()
	if err := iw.encode(list, &iw.buf); err != nil {
		return err
	}
	out := iw.buf.Bytes()
	at := bytes.Index(out, itemsKey)
	if at < 0 {
		return fmt.Errorf("encoding %d items of a list: no items in %.100q", len(iw.chunk), out)
	}
	body, ok := bytes.CutSuffix(out[at+len(itemsKey):], listEnd)
	if !ok {
		return fmt.Errorf("encoding %d items of a list: unexpected end in %.100q", len(iw.chunk), out)
	}
	if iw.written > 0 {
		iw.out.WriteByte(',')
	}
	iw.written += len(iw.chunk)
	iw.out.Write(body)
	return iw.flushIfFull()
}

func (iw *itemWriter) flushIfFull() error {
	if iw.out.Len() < sharedListFlush {
		return nil
	}
	return iw.flush()
}

func (iw *itemWriter) flush() error {
	_, err := iw.w.Write(iw.out.Bytes())
	iw.out.Reset()
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
	items, err := decoded(items)
	if err != nil {
		return nil, err
	}
	if err := meta.SetList(out, items); err != nil {
		return nil, err
	}
	return out, setListMeta(out, &l.ListMeta)
}

// decoded returns items with the cache's objects decoded, which the items
// of a typed list must be.
func decoded(items []runtime.Object) ([]runtime.Object, error) {
	out := items
	for i, o := range items {
		if _, ok := o.(listItem); !ok {
			continue
		}
		if &out[0] == &items[0] {
			out = slices.Clone(items)
		}
		if out[i] = o.DeepCopyObject(); out[i] == nil {
			return nil, errUnreadableItem
		}
	}
	return out, nil
}

// errUnreadableItem is the error of a list with an item the cache could
// not read: a compressed object whose bytes were corrupt, which the cache
// refuses, and lists again to replace.
var errUnreadableItem = errors.New("the watch cache could not read an item of the list; it is listing again, retry shortly")

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
