package object

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

// Object is one cached object version: its encoded bytes and what
// selectors need, computed once at ingest. No decoded Go object is kept;
// what needs one decodes the bytes (Decode). Objects are immutable once
// built, but for co, and shared by the store, snapshots, the event log and
// every watcher. What else selectors and watchers see of it, the cache
// makes when they need it.
//
// An Object is also what a SharingList receives as an item: a
// runtime.Object whose DeepCopyObject is the decoded object, and whose
// ListItem gives its bytes to a list.
type Object struct {
	Key string
	// Raw is the object at its storage version, as BuilderConfig.Codec encodes it,
	// resourceVersion set: the bytes a compact JSON response at that
	// version holds (codec.rawFor tells which responses those are). A
	// cache that compresses (BuilderConfig.Compression) keeps them in body
	// instead, and Raw is nil. Read them with Bytes, whichever holds them.
	Raw []byte
	// body holds the object's bytes in place of Raw in a cache that
	// compresses: as they are while the version is recent, then compressed
	// by Pack, which swaps the body whole, so that every holder of the
	// object (the store, its snapshots, the history, watchers, lists' gzip
	// runs) sees one copy of them. nil where Raw holds them.
	body atomic.Pointer[body]
	// Codec decodes raw and knows which encoders write it.
	Codec *Codec
	// co is the object's Caching while it was sent recently (Object.Caching).
	co atomic.Pointer[Caching]
	// labels are the object's labels, shared between objects that have the
	// same set; nil for none.
	labels *Labels
	// attrs are what selectors need beyond the fields above, shared between
	// objects that need the same; nil if they need nothing more.
	attrs *attrs
	RV    uint64
	// Trigger is the value of BuilderConfig.TriggerField, if any.
	Trigger string
	// Hashes are the shard Hashes of the object's UID and namespace.
	Hashes shard.Hashes
	// Head is the length of raw's type header, {"kind":…,"apiVersion":…,
	// which an item of a list does not have; 0 if raw has none.
	Head uint16
	// nameAt is where the object's name starts in Key, which ends in it as
	// the registry's keys do, or nameApart when attrs holds it.
	nameAt uint16
	// size is the length of the bytes body holds, sizeNewline set when they
	// end in a newline: a compressed object's length is not its record's.
	// It fills what the two fields above leave of a word.
	size uint32
}

// attrs are an object's selectable fields and index values, which not
// every object has, behind one pointer. With the name kept as an offset
// into the key, they take each version's record from 176 to 128 bytes
// (docs/architecture.md, "The object as its bytes").
type attrs struct {
	// fields are the selectable fields other than the name and the trigger
	// field, as name and value pairs, shared between objects that have the
	// same (see interner.fields).
	fields []string
	// indexed are the values of BuilderConfig.Indexers other than the
	// trigger's, in the order of Builder.IndexFuncs; nil without such indexers.
	indexed [][]string
	// name is the object's name when its key does not end in it.
	name string
}

// nameApart is Object.nameAt for a name its key does not end in.
const nameApart = math.MaxUint16

// SetName makes name the object's name: a substring of its key when the
// key ends in it, so that the object keeps no second copy. Only a builder
// calls it, before anyone else holds the object.
func (o *Object) SetName(name string) {
	at := len(o.Key) - len(name)
	if at >= 0 && at < nameApart && o.Key[at:] == name && (at == 0 || o.Key[at-1] == '/') {
		o.nameAt = uint16(at)
		return
	}
	o.nameAt = nameApart
	o.ownAttrs().name = name
}

// ownAttrs gives the object attrs of its own, a copy of those it may share
// with other objects, and returns them to be set. Only a builder calls it.
func (o *Object) ownAttrs() *attrs {
	var a attrs
	if o.attrs != nil {
		a = *o.attrs
	}
	o.attrs = &a
	return &a
}

// Name is the object's metadata.name.
func (o *Object) Name() string {
	if o.nameAt == nameApart {
		return o.attrs.name
	}
	return o.Key[o.nameAt:]
}

// SetLabels makes l the object's labels. Only what makes the object calls
// it, before anyone else holds it.
func (o *Object) SetLabels(l *Labels) { o.labels = l }

// Labels are the object's labels, for a selector to match: a nil *Labels,
// the empty set, when it has none. They are shared: read only.
func (o *Object) Labels() *Labels { return o.labels }

// Fields are the object's selectable fields other than the name and the
// trigger field, as name and value pairs.
func (o *Object) Fields() []string {
	if o.attrs == nil {
		return nil
	}
	return o.attrs.fields
}

// objectOverhead is what an object holds beyond its bytes, for the
// history budget: this struct, its key, its store and log entries.
const objectOverhead = 300

// Size is what the object holds, for the history budget: its bytes
// uncompressed, however they are kept (Len), so that a version counts the
// same when it leaves the history as when it entered, and the budget and
// its gauge show no compressed size.
func (o *Object) Size() int64 {
	if o.body.Load() == nil {
		return int64(cap(o.Raw)) + objectOverhead
	}
	return int64(o.Len()) + objectOverhead
}

// StoredSize is the size of the value etcd holds for the object when the
// storage's codec wrote it, before any transformer (encryption at rest adds
// its header and padding). In JSON, that is its bytes without the
// resourceVersion field, which etcd3 does not store, and that field's
// comma: metadata holds at least a name beside it. In any other encoding
// (protobuf), it is the bytes' length, a few bytes more than etcd's.
func (o *Object) StoredSize() int64 {
	if o.RV == 0 || o.Head == 0 {
		return int64(o.Len())
	}
	var rv [20]byte
	return int64(o.Len() - len(`"resourceVersion":"",`) - len(strconv.AppendUint(rv[:0], o.RV, 10)))
}

// Decode returns a new decoded copy of the object, which the caller owns.
func (o *Object) Decode() (runtime.Object, error) {
	obj := o.Codec.newFunc()
	if err := o.DecodeInto(obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// DecodeInto decodes the object into into, an object of NewFunc's type.
func (o *Object) DecodeInto(into runtime.Object) error {
	out, err := o.Codec.decode(o, into)
	switch {
	case err != nil:
		return fmt.Errorf("decoding the cached %s: %w", o.Key, err)
	case out != into:
		return fmt.Errorf("decoding the cached %s: got %T, not %T", o.Key, out, into)
	}
	return nil
}

// At returns the object with its resourceVersion set to rv: what a
// watcher that the change At rv moved out of its selector is sent.
func (o *Object) At(v storage.Versioner, rv uint64) (*Object, error) {
	obj, err := o.Decode()
	if err != nil {
		return nil, err
	}
	if err := v.UpdateObject(obj, rv); err != nil {
		return nil, err
	}
	raw, err := o.Codec.Encode(obj)
	if err != nil {
		return nil, err
	}
	// Its bytes are its own, in Raw: it is sent now, and kept only with the
	// event that leaves, never compressed.
	return &Object{Key: o.Key, nameAt: o.nameAt, Raw: raw, Head: TypeHeader(raw), Codec: o.Codec, labels: o.labels,
		attrs: o.attrs, RV: rv, Trigger: o.Trigger, Hashes: o.Hashes}, nil
}

// ListItem tells whether the object's bytes are its item in a list that
// encode, whose identifier is id, writes: the object's bytes without their
// type header and their final newline, when that encoder writes the
// object's bytes, compact JSON at the storage version. The item is then
// open, followed by the n bytes AppendItem appends, read only when they are
// written. ok is false for any other encoder, and the caller encodes a
// decoded copy (DeepCopyObject).
func (o *Object) ListItem(id runtime.Identifier, encode func(runtime.Object, io.Writer) error) (open []byte, n int, ok bool) {
	if o.Head == 0 || !o.Codec.rawFor(id, o, encode) {
		return nil, 0, false
	}
	n = o.Len() - int(o.Head)
	if o.endsInNewline() {
		n--
	}
	return openBrace, n, true
}

// AppendItem appends to dst the object's bytes as a list's item, after the
// open ListItem returns: decompressed into dst where they are compressed
// and dst has room. It fails only on a corrupt object (Bytes).
func (o *Object) AppendItem(dst []byte) ([]byte, error) {
	room := dst[len(dst):]
	if o.Record() != nil && cap(room) < o.Len() {
		// Too little room to decompress the whole object, type header
		// included: into a buffer of the pool's, not a new one. (Bytes
		// of an object kept as it is are its own, never the pool's.)
		buf := itemBuffers.Get().(*[]byte)
		defer itemBuffers.Put(buf)
		room = slices.Grow((*buf)[:0], o.Len())
		if cap(room) <= maxScratch {
			*buf = room
		}
	}
	b, err := o.Bytes(room)
	if err != nil {
		return dst, err
	}
	if int(o.Head) > len(b) {
		return dst, fmt.Errorf("the cached %s at %d: %d bytes, shorter than its type header", o.Key, o.RV, len(b))
	}
	// Where b was decompressed into dst's room, the item moves down over
	// the type header before it.
	return append(dst, bytes.TrimSuffix(b[o.Head:], []byte("\n"))...), nil
}

var openBrace = []byte("{")

// itemBuffers hold what AppendItem decompresses an object into when its
// caller's buffer has no room for it.
var itemBuffers = sync.Pool{New: func() any { return new([]byte) }}

// GetObjectKind implements runtime.Object: a cached object's kind is not
// held, as a list's items in a typed list do not hold theirs.
func (o *Object) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object: it returns the decoded object,
// which the caller owns. An object that cannot be decoded, which ingest
// never keeps, returns nil.
func (o *Object) DeepCopyObject() runtime.Object {
	obj, err := o.Decode()
	if err != nil {
		return nil
	}
	return obj
}

// GetObjectMeta implements metav1.ObjectMetaAccessor, for meta.Accessor:
// the metadata of a decoded copy. An object that cannot be decoded, which
// ingest never keeps, has empty metadata.
func (o *Object) GetObjectMeta() metav1.Object { return metadataOf(o.DeepCopyObject()) }

// metadataOf returns obj's metadata; empty metadata if it has none, or if
// obj is nil because it could not be decoded.
func metadataOf(obj runtime.Object) metav1.Object {
	if m, err := meta.Accessor(obj); err == nil {
		return m
	}
	return &metav1.ObjectMeta{}
}

// TypeHeader returns the length of raw's type header: the JSON a
// serializer writes for an object's TypeMeta, which comes first, as in
// every Kubernetes type; 0 if raw does not begin with one.
func TypeHeader(raw []byte) uint16 {
	_, _, n := parseTypeHeader(raw)
	return n
}

// parseTypeHeader returns the kind and apiVersion of raw's type header and
// its length, or a length of 0 if raw does not begin with one, or if the
// header holds an escape.
func parseTypeHeader(raw []byte) (kind, apiVersion []byte, n uint16) {
	rest, ok := bytes.CutPrefix(raw, []byte(`{"kind":"`))
	if !ok {
		return nil, nil, 0
	}
	kind, rest, ok = cutString(rest)
	if !ok {
		return nil, nil, 0
	}
	rest, ok = bytes.CutPrefix(rest, []byte(`,"apiVersion":"`))
	if !ok {
		return nil, nil, 0
	}
	apiVersion, rest, ok = cutString(rest)
	if !ok {
		return nil, nil, 0
	}
	rest, ok = bytes.CutPrefix(rest, []byte(`,`))
	if !ok || len(raw)-len(rest) > 1<<16-1 {
		return nil, nil, 0
	}
	return kind, apiVersion, uint16(len(raw) - len(rest))
}

// cutString cuts a JSON string's contents, up to its closing quote, from
// the front of b; ok is false if it holds an escape or does not end.
func cutString(b []byte) (s, rest []byte, ok bool) {
	i := bytes.IndexAny(b, `"\`)
	if i < 0 || b[i] != '"' {
		return nil, nil, false
	}
	return b[:i], b[i+1:], true
}

// NameField is the field the registry's single-object watches select on,
// which an object keeps as Name.
const NameField = "metadata.name"
