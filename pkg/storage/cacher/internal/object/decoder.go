package object

import (
	"encoding/json"
	"reflect"
	"strings"
	"sync"

	jsoniter "github.com/json-iterator/go"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// jsonDecoder decodes the cache's own bytes into the versioned type their
// header names, as the storage's JSON serializer does, but in half the
// time: 19.2 → 9.5 µs for a pod of 1 KiB, medians of 5 in one run
// (BenchmarkDecode), and 14.5 → 7 µs for bench-scale's Assignment.
//
// The storage's serializer unmarshals with sigs.k8s.io/json, a fork of
// encoding/json, which checks the whole document and then scans it again,
// a byte at a time. A decode is what a Table, another version, YAML or an
// update's suggestion costs the cache, and upstream's cache, holding the
// decoded struct, pays none of it. jsoniter (already in every apiserver
// through structured-merge-diff) parses in one pass.
//
// jsoniter is not encoding/json, so it is used only where the two cannot
// differ:
//   - on the cache's own bytes, which the storage's encoder wrote from a
//     decoded object of the same types: compact, valid UTF-8, every key a
//     field's exact name and present once, numbers as the encoder writes
//     them. What sets the two apart (case-insensitive or colliding keys,
//     unknown fields, duplicates, invalid UTF-8) cannot occur in them;
//   - case-sensitively, as Kubernetes decodes;
//   - into types with no interface{} inside, whose numbers encoding/json
//     would give as float64 and the storage's serializer as int64 where
//     they fit (safe).
//
// Anything else, and anything jsoniter fails on, goes to the serializer.
// TestDecoderMatchesStorage compares the two over fuzzed objects.
type jsonDecoder struct {
	// api is caseSensitive, or sharing for bytes that never change.
	api jsoniter.API
	// scheme makes the versioned object for a header's kind.
	scheme *runtime.Scheme
	// serializer decodes what jsoniter does not.
	serializer runtime.Decoder

	// mu guards safe.
	mu sync.RWMutex
	// safe holds whether each type met is one jsoniter decodes as the
	// serializer does.
	safe map[reflect.Type]bool
}

// caseSensitive is jsoniter matching keys case-sensitively, as every
// Kubernetes decoder does since 1.20, with plain strings found fast
// (stringDecoder).
var caseSensitive = newAPI(false)

// sharing is caseSensitive with a decoded object's strings sharing the
// bytes decoded instead of copied from them: for the cache's own bytes,
// which never change once built. At 10 KiB, a copy of the annotation was
// most of a decode's time (BenchmarkDecode, jsoniter-shared beside
// jsoniter).
//
// A decoded object then holds the cache's bytes while it lives, as a
// list's items from upstream's Cacher hold its cached objects' strings.
// What the cache decodes serves one request, or one watch event's
// encodings (Caching), and is dropped.
var sharing = newAPI(true)

func newAPI(share bool) jsoniter.API {
	api := jsoniter.Config{CaseSensitive: true, ValidateJsonRawMessage: true, ObjectFieldMustBeSimpleString: true}.Froze()
	api.RegisterExtension(&plainStrings{share: share})
	return api
}

var _ runtime.Decoder = &jsonDecoder{}

// Decode implements runtime.Decoder.
func (d *jsonDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if obj, gvk, ok := d.decodeFast(data, into); ok {
		return obj, gvk, nil
	}
	return d.serializer.Decode(data, defaults, into)
}

// decodeFast decodes data with jsoniter into the versioned object its
// header names, or into into if it is of that type; ok is false where the
// serializer must decode instead.
func (d *jsonDecoder) decodeFast(data []byte, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, bool) {
	switch into.(type) {
	case runtime.Unstructured, *runtime.Unknown:
		return nil, nil, false
	}
	gvk, err := headerMeta{}.Interpret(data)
	if err != nil {
		return nil, nil, false
	}
	obj, err := runtime.UseOrCreateObject(d.scheme, d.scheme, *gvk, into)
	if err != nil || !d.safeType(reflect.TypeOf(obj)) {
		return nil, nil, false
	}
	if err := d.api.Unmarshal(data, obj); err != nil {
		return nil, nil, false
	}
	return obj, gvk, true
}

// safeType reports whether t holds no interface{} that encoding/json
// would fill.
func (d *jsonDecoder) safeType(t reflect.Type) bool {
	d.mu.RLock()
	ok, known := d.safe[t]
	d.mu.RUnlock()
	if known {
		return ok
	}
	ok = noInterface(t, map[reflect.Type]bool{})
	d.mu.Lock()
	d.safe[t] = ok
	d.mu.Unlock()
	return ok
}

var unmarshaler = reflect.TypeFor[json.Unmarshaler]()

// noInterface reports whether no value JSON decodes into t by reflection
// is an interface. A type that decodes itself (json.Unmarshaler) is left
// to itself, as both decoders call it.
func noInterface(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] || reflect.PointerTo(t).Implements(unmarshaler) {
		return true
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Interface:
		return false
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return noInterface(t.Elem(), seen)
	case reflect.Map:
		return noInterface(t.Key(), seen) && noInterface(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name == "-" || (!f.IsExported() && !f.Anonymous) {
				continue
			}
			if !noInterface(f.Type, seen) {
				return false
			}
		}
	}
	return true
}
