package object

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/compress"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

// BuilderConfig is what a Builder needs to know of the resource.
type BuilderConfig struct {
	// Codec encodes an object at its storage version; Scheme, if set, is
	// the scheme its serializer was made from; NewFunc returns an empty
	// object (the cache's Config documents each).
	Codec   runtime.Codec
	Scheme  *runtime.Scheme
	NewFunc func() runtime.Object
	// KeyFunc, GetAttrsFunc and Versioner read an object's key, labels and
	// fields, and resourceVersion.
	KeyFunc      func(runtime.Object) (string, error)
	GetAttrsFunc storage.AttrFunc
	Versioner    storage.Versioner
	// TriggerField names the IndexerFuncs entry an object keeps the value
	// of, for the watcher index; "" for none.
	TriggerField string
	IndexerFuncs storage.IndexerFuncs
	// Indexers are the indexes lists with selectors use; an object keeps
	// their values, but the trigger field's, which it keeps already.
	Indexers *cache.Indexers
	// Expiry forgets the Cachings of the objects, which lists' shared runs
	// are kept with (GzipStream.WriteItem); nil keeps them while the object
	// is current.
	Expiry *Expiry
	// Compression, if set, is the codec the objects' bytes may be
	// compressed with at rest: they are then kept in a body that Pack
	// compresses later, and read through Bytes. Nil keeps them in Raw.
	Compression *compress.Codec
	// Corrupt, if set, is told of each read of an object whose compressed
	// bytes did not decompress to what they were made from, which the
	// read refuses; the cache lists again.
	Corrupt func(*Object, error)
}

// Builder makes the cached version of an object: its bytes and what
// selectors need, with equal label sets and fields shared between the
// objects it makes.
type Builder struct {
	cfg    BuilderConfig
	codec  *Codec
	intern *interner
	// indexers are BuilderConfig.Indexers other than the trigger field's, whose
	// values each object keeps, by name in Object.Indexed's order.
	indexers []namedIndexer
	// splice is what the first object whose bytes spliceRV wrote showed:
	// spliceUnknown until then.
	splice atomic.Int32
}

// What Builder.splice knows of spliceRV for the resource's objects.
const (
	spliceUnknown = iota
	// spliceRight: spliceRV wrote the bytes the codec encodes.
	spliceRight
	// spliceWrong: it did not, and the resource's objects are encoded.
	spliceWrong
)

// NewBuilder returns a Builder for cfg.
func NewBuilder(cfg BuilderConfig) *Builder {
	return &Builder{cfg: cfg, codec: newCodec(cfg), intern: newInterner(defaultInternBudget),
		indexers: extraIndexers(cfg)}
}

// Codec returns the codec of the objects b makes.
func (b *Builder) Codec() *Codec { return b.codec }

// Key returns obj's key, as Build would.
func (b *Builder) Key(obj runtime.Object) (string, error) {
	obj, _ = unwrap(obj)
	return b.cfg.KeyFunc(obj)
}

// Build computes what the cache keeps for obj: its bytes and what
// selectors need. obj is not kept. A *StoredItem with its stored bytes
// has its bytes written from them (spliceRV), not encoded.
func (b *Builder) Build(obj runtime.Object) (*Object, error) {
	obj, stored := unwrap(obj)
	key, err := b.cfg.KeyFunc(obj)
	if err != nil {
		return nil, fmt.Errorf("key of %T: %w", obj, err)
	}
	l, f, err := b.cfg.GetAttrsFunc(obj)
	if err != nil {
		return nil, fmt.Errorf("attributes of %s: %w", key, err)
	}
	rv, err := b.cfg.Versioner.ObjectResourceVersion(obj)
	if err != nil {
		return nil, fmt.Errorf("resourceVersion of %s: %w", key, err)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", key, err)
	}
	var trigger string
	if b.cfg.TriggerField != "" {
		trigger = b.cfg.IndexerFuncs[b.cfg.TriggerField](obj)
	}
	room := len(key) + len(trigger)
	if b.cfg.Compression != nil {
		room = 0 // the strings are packed apart
	}
	raw, ok := b.spliced(obj, stored, m.GetResourceVersion(), room)
	if !ok {
		if raw, err = b.codec.encode(obj, room); err != nil {
			return nil, fmt.Errorf("encoding %s: %w", key, err)
		}
	}
	o := &Object{Key: key, Head: TypeHeader(raw), Codec: b.codec, RV: rv, Trigger: trigger}
	if b.cfg.Compression == nil {
		o.Raw = pack(raw, &o.Key, &o.Trigger)
	} else {
		// The strings get an allocation of their own: compressing the
		// bytes later frees theirs, which nothing else may point into.
		pack(make([]byte, 0, len(key)+len(trigger)), &o.Key, &o.Trigger)
		if err := o.setBody(raw); err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
	}
	if len(l) > 0 {
		o.labels = b.intern.labels(l)
	}
	o.attrs = b.intern.fields(f, b.cfg.TriggerField)
	o.Hashes[shard.ByUID] = shard.Hash(string(m.GetUID()))
	o.Hashes[shard.ByNamespace] = shard.Hash(m.GetNamespace())
	if len(b.indexers) > 0 {
		a := o.ownAttrs()
		a.indexed = make([][]string, len(b.indexers))
		for i, ix := range b.indexers {
			values, err := ix.fn(obj)
			if err != nil {
				klog.ErrorS(err, "Indexer failed", "index", ix.name, "key", key)
			}
			a.indexed[i] = values
		}
	}
	o.SetName(m.GetName())
	return o, nil
}

// spliced returns spliceRV's bytes for obj, from stored, if it can write
// them. The first time it does, it checks them against obj's encode: an
// ObjectMeta's fields are always written in one order, so one object shows
// where the resource's objects have their resourceVersion. If they differ,
// it never splices again.
func (b *Builder) spliced(obj runtime.Object, stored []byte, rv string, room int) ([]byte, bool) {
	state := b.splice.Load()
	if stored == nil || state == spliceWrong {
		return nil, false
	}
	raw, ok := spliceRV(stored, rv, room)
	if !ok || state == spliceRight {
		return raw, ok
	}
	if enc, err := b.codec.Encode(obj); err != nil || !bytes.Equal(enc, raw) {
		b.splice.Store(spliceWrong)
		klog.ErrorS(err, "The resourceVersion spliced into an object's stored bytes is not where its encoder writes it; encoding every object instead", "type", fmt.Sprintf("%T", obj))
		return nil, false
	}
	b.splice.CompareAndSwap(spliceUnknown, spliceRight)
	return raw, true
}

// pack lays the strings after raw, in its capacity, and points them at
// their copies there: one allocation for what an object holds of its own,
// where three took each its own size class (docs/benchmarks.md, "Where
// the heap goes"). The bytes are the object's, never written again and
// never reused while a string points into them; the slice it returns ends
// where the strings begin, so that no append reaches them. Without room in
// raw's capacity the strings get an allocation of their own.
func pack(raw []byte, strs ...*string) []byte {
	n := len(raw)
	for _, s := range strs {
		if at := len(raw); *s != "" {
			raw = append(raw, *s...)
			*s = unsafe.String(&raw[at], len(*s))
		}
	}
	return raw[:n:n]
}

// namedIndexer is one of BuilderConfig.Indexers.
type namedIndexer struct {
	name string
	fn   cache.IndexFunc
}

// extraIndexers returns cfg.Indexers but the trigger field's, in a fixed
// order: the trigger function and the indexer give the same values, and
// the object keeps the trigger's.
func extraIndexers(cfg BuilderConfig) []namedIndexer {
	var out []namedIndexer
	if cfg.Indexers == nil {
		return nil
	}
	for name, fn := range *cfg.Indexers {
		if cfg.TriggerField != "" && name == storage.FieldIndex(cfg.TriggerField) {
			continue
		}
		out = append(out, namedIndexer{name: name, fn: fn})
	}
	slices.SortFunc(out, func(a, b namedIndexer) int { return strings.Compare(a.name, b.name) })
	return out
}

// IndexFuncs returns the index functions of the objects b makes: by the
// indexers' names, and the trigger field's index.
func (b *Builder) IndexFuncs() map[string]func(*Object) []string {
	fns := map[string]func(*Object) []string{}
	for i, ix := range b.indexers {
		fns[ix.name] = func(o *Object) []string {
			if o.attrs == nil || i >= len(o.attrs.indexed) {
				return nil
			}
			return o.attrs.indexed[i]
		}
	}
	if b.cfg.TriggerField != "" {
		fns[storage.FieldIndex(b.cfg.TriggerField)] = func(o *Object) []string { return []string{o.Trigger} }
	}
	return fns
}
