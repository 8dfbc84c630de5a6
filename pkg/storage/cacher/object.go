package cacher

import (
	"bytes"
	"fmt"
	"io"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

// object is one cached object version: its encoded bytes and what
// selectors need, computed once at ingest. No decoded Go object is kept;
// what needs one decodes the bytes (decode). Objects are immutable once
// built, but for co, and shared by the store, snapshots, the event log and
// every watcher. What else selectors and watchers see of it, the presenter
// makes when they need it.
//
// An object is also what a SharingList receives as an item: a
// runtime.Object whose DeepCopyObject is the decoded object, and whose
// ListItem gives its bytes to a list.
type object struct {
	key string
	// name is the object's metadata.name: a substring of key when key ends
	// in it, as the registry's keys do.
	name string
	// raw is the object at its storage version, as Config.Codec encodes it,
	// resourceVersion set: the bytes a compact JSON response at that
	// version holds (codec.rawFor tells which responses those are).
	raw []byte
	// head is the length of raw's type header, {"kind":…,"apiVersion":…,
	// which an item of a list does not have; 0 if raw has none.
	head uint16
	// codec decodes raw and knows which encoders write it.
	codec *objectCodec
	// co is the object's cachingObject while it was sent recently (presenter.caching).
	co     atomic.Pointer[cachingObject]
	labels labels.Set
	// fields are the selectable fields other than the name and the trigger
	// field, as name and value pairs, shared between objects that have the
	// same (see interner.fields).
	fields []string
	// indexed are the values of Config.Indexers other than the trigger's,
	// in the order of objectCodec.indexers; nil without such indexers.
	indexed [][]string
	rv      uint64
	// trigger is the value of Config.TriggerField, if any.
	trigger string
	// hashes are the shard hashes of the object's UID and namespace.
	hashes shard.Hashes
}

// objectOverhead is what an object holds beyond its bytes, for the
// history budget: this struct, its key, its store and log entries.
const objectOverhead = 300

// size is what the object holds, for the history budget.
func (o *object) size() int64 { return int64(cap(o.raw)) + objectOverhead }

// decode returns a new decoded copy of the object, which the caller owns.
func (o *object) decode() (runtime.Object, error) {
	obj := o.codec.newFunc()
	if err := o.decodeInto(obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// decodeInto decodes the object into into, an object of NewFunc's type.
func (o *object) decodeInto(into runtime.Object) error {
	out, err := o.codec.decode(o, into)
	switch {
	case err != nil:
		return fmt.Errorf("decoding the cached %s: %w", o.key, err)
	case out != into:
		return fmt.Errorf("decoding the cached %s: got %T, not %T", o.key, out, into)
	}
	return nil
}

// at returns the object with its resourceVersion set to rv: what a
// watcher that the change at rv moved out of its selector is sent.
func (o *object) at(v storage.Versioner, rv uint64) (*object, error) {
	obj, err := o.decode()
	if err != nil {
		return nil, err
	}
	if err := v.UpdateObject(obj, rv); err != nil {
		return nil, err
	}
	raw, err := o.codec.encode(obj)
	if err != nil {
		return nil, err
	}
	return &object{key: o.key, name: o.name, raw: raw, head: typeHeader(raw), codec: o.codec, labels: o.labels,
		fields: o.fields, indexed: o.indexed, rv: rv, trigger: o.trigger, hashes: o.hashes}, nil
}

// ListItem returns the object as the items of a list encoded by encode,
// whose identifier is id, hold it: the concatenation of open and rest,
// without a copy. That is the object's bytes without their type header
// and their final newline, when that encoder writes the object's bytes,
// compact JSON at the storage version. ok is false for any other encoder,
// and the caller encodes a decoded copy (DeepCopyObject).
func (o *object) ListItem(id runtime.Identifier, encode func(runtime.Object, io.Writer) error) (open, rest []byte, ok bool) {
	if o.head == 0 || !o.codec.rawFor(id, o, encode) {
		return nil, nil, false
	}
	return openBrace, bytes.TrimSuffix(o.raw[o.head:], []byte("\n")), true
}

var openBrace = []byte("{")

// GetObjectKind implements runtime.Object: a cached object's kind is not
// held, as a list's items in a typed list do not hold theirs.
func (o *object) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object: it returns the decoded object,
// which the caller owns. An object that cannot be decoded, which ingest
// never keeps, returns nil.
func (o *object) DeepCopyObject() runtime.Object {
	obj, err := o.decode()
	if err != nil {
		return nil
	}
	return obj
}

// GetObjectMeta implements metav1.ObjectMetaAccessor, for meta.Accessor:
// the metadata of a decoded copy. An object that cannot be decoded, which
// ingest never keeps, has empty metadata.
func (o *object) GetObjectMeta() metav1.Object { return metadataOf(o.DeepCopyObject()) }

// metadataOf returns obj's metadata; empty metadata if it has none, or if
// obj is nil because it could not be decoded.
func metadataOf(obj runtime.Object) metav1.Object {
	if m, err := meta.Accessor(obj); err == nil {
		return m
	}
	return &metav1.ObjectMeta{}
}

// typeHeader returns the length of raw's type header: the JSON a
// serializer writes for an object's TypeMeta, which comes first, as in
// every Kubernetes type; 0 if raw does not begin with one.
func typeHeader(raw []byte) uint16 {
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
