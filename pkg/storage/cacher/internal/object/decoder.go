package object

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// jsonDecoder decodes the cache's own bytes into the versioned type their
// header names, as the storage's JSON serializer does, in a fraction of
// the time: the bytes are read once, by a decoder of our own for exactly
// what the storage's encoder writes (decodeExact).
//
// The storage's serializer unmarshals with sigs.k8s.io/json, a fork of
// encoding/json, which checks the whole document and then scans it again,
// a byte at a time. A decode is what a Table, another version, YAML or an
// update's suggestion costs the cache, and upstream's cache, holding the
// decoded struct, pays none of it.
//
// decodeExact is not encoding/json: it is used only where the two cannot
// differ: on bytes the storage's encoder wrote, compact, valid UTF-8,
// every key a field's exact name, in the fields' order; case-sensitively,
// as Kubernetes decodes; into types it knows to decode as encoding/json
// does. Anything else, and anything it fails on, goes to the serializer.
// TestDecoderMatchesStorage compares the two over fuzzed objects.
type jsonDecoder struct {
	// scheme makes the versioned object for a header's kind.
	scheme *runtime.Scheme
	// meta reads the type header.
	meta *headerMeta
	// serializer decodes what decodeExact does not.
	serializer runtime.Decoder
	// share is decodeExact's: for the cache's own bytes, which never change.
	share bool
}

var _ runtime.Decoder = &jsonDecoder{}

// newJSONDecoder returns a jsonDecoder for scheme's types, falling back
// to the storage's JSON serializer (not strict), with the type read from
// the header the cache's own bytes begin with.
func newJSONDecoder(scheme *runtime.Scheme, share bool) *jsonDecoder {
	meta := &headerMeta{}
	s := jsonserializer.NewSerializerWithOptions(meta, scheme, scheme, jsonserializer.SerializerOptions{})
	return &jsonDecoder{scheme: scheme, meta: meta, serializer: s, share: share}
}

// Decode implements runtime.Decoder.
func (d *jsonDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if obj, gvk, ok := d.decodeFast(data, into); ok {
		return obj, gvk, nil
	}
	return d.serializer.Decode(data, defaults, into)
}

// decodeFast decodes data with decodeExact into the versioned object its
// header names, or into into if it is of that type; ok is false where the
// serializer must decode instead.
func (d *jsonDecoder) decodeFast(data []byte, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, bool) {
	switch into.(type) {
	case runtime.Unstructured, *runtime.Unknown:
		return nil, nil, false
	}
	gvk, err := d.meta.Interpret(data)
	if err != nil {
		return nil, nil, false
	}
	obj, err := runtime.UseOrCreateObject(d.scheme, d.scheme, *gvk, into)
	if err != nil {
		return nil, nil, false
	}
	if err := decodeExact(data, obj, d.share); err != nil {
		return nil, nil, false
	}
	return obj, gvk, true
}
