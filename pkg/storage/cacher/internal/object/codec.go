package object

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/versioning"
)

// Codec makes a cached object's bytes and decodes them, and learns
// which response encoders write those same bytes, so that their responses
// are written from the bytes instead of encoded.
//
// The bytes are BuilderConfig.Codec's, the storage's codec: its encoder writes an
// object at its storage version, as a response at that version in compact
// JSON does. The generic handlers name each encoder by an identifier; the
// first time an object is encoded with one, the output is compared with
// the object's bytes, and equal means that encoder writes the bytes for
// every object, since encoders are pure functions of the object: same
// version, same serializer, same options. Anything else (another version,
// YAML, pretty JSON, a Table) is encoded from a decoded copy, once per
// object version while it is sent (Caching).
type Codec struct {
	codec runtime.Codec
	// decoder decodes the cached bytes, as codec does, without reading them
	// once more to find their type: nil without BuilderConfig.Scheme.
	decoder runtime.Decoder
	newFunc func() runtime.Object
	// expiry is what forgets the Cachings of the cache's objects, or nil
	// (BuilderConfig.Expiry).
	expiry *Expiry

	// mu guards encoders.
	mu       sync.RWMutex
	encoders map[runtime.Identifier]encoderKind
}

// encoderKind is what the cache knows of an encoder.
type encoderKind uint8

const (
	encoderUnknown encoderKind = iota
	// encoderRaw writes the cached bytes.
	encoderRaw
	// encoderWatch is the watch handler's: it frames an event around what
	// its embedded encoder writes, and asks the object for that too.
	encoderWatch
	// encoderOther writes something else.
	encoderOther
	// encoderUncached is one whose output must not be shared: the watch
	// handler's Table encoder writes the column headers for the first event
	// of a watch only, and tells that it did by encoding (it changes its
	// identifier then). An encoding made for another watch's first event
	// would skip that, and give this watch's next events headers too.
	encoderUncached
	// encoderWatchUncached is the watch encoder around an encoderUncached.
	encoderWatchUncached
)

func newCodec(codec runtime.Codec, scheme *runtime.Scheme, newFunc func() runtime.Object, expiry *Expiry) *Codec {
	c := &Codec{codec: codec, newFunc: newFunc, expiry: expiry, encoders: map[runtime.Identifier]encoderKind{}}
	if scheme != nil {
		// As the storage's codec decodes (k8s.io/apiserver's storage codec:
		// JSON, not strict, defaulted, converted into the caller's type), but
		// with the type taken from the header the cache's own bytes begin
		// with, and unmarshalled in one pass (jsonDecoder).
		s := jsonserializer.NewSerializerWithOptions(headerMeta{}, scheme, scheme, jsonserializer.SerializerOptions{})
		d := &jsonDecoder{scheme: scheme, serializer: s, share: true}
		c.decoder = versioning.NewDefaultingCodecForScheme(scheme, nil, d, nil, runtime.InternalGroupVersioner)
	}
	return c
}

// decode decodes o's bytes into into: with decoder if they are JSON with
// a type header, else with the storage's codec.
func (c *Codec) decode(o *Object, into runtime.Object) (runtime.Object, error) {
	d := runtime.Decoder(c.codec)
	if c.decoder != nil && o.Head > 0 {
		d = c.decoder
	}
	out, _, err := d.Decode(o.Raw, nil, into)
	return out, err
}

// headerMeta finds the type of the cache's bytes in their type header,
// without the whole-document parse of json.DefaultMetaFactory: that parse is
// nearly half of a decode's time. It is exact for bytes the storage's
// encoder wrote, which have each key once; other bytes, which the cache does
// not keep, could name their type again after the header, and
// DefaultMetaFactory would read the last.
type headerMeta struct{}

func (headerMeta) Interpret(data []byte) (*schema.GroupVersionKind, error) {
	kind, apiVersion, n := parseTypeHeader(data)
	if n == 0 {
		return nil, fmt.Errorf("no type header in the cached bytes")
	}
	gv, err := schema.ParseGroupVersion(string(apiVersion))
	if err != nil {
		return nil, err
	}
	gvk := gv.WithKind(string(kind))
	return &gvk, nil
}

// Encode returns obj's bytes: its encoding, in a slice of its own length.
func (c *Codec) Encode(obj runtime.Object) ([]byte, error) {
	buf := scratch.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxScratch {
			scratch.Put(buf)
		}
	}()
	buf.Reset()
	if err := c.codec.Encode(obj, buf); err != nil {
		return nil, err
	}
	return bytes.Clone(buf.Bytes()), nil
}

// kind returns what is known of the encoder id.
func (c *Codec) kind(id runtime.Identifier) encoderKind {
	c.mu.RLock()
	k, ok := c.encoders[id]
	c.mu.RUnlock()
	if !ok {
		k = handlerEncoderKind(id)
		if k != encoderUnknown {
			c.learned(id, k)
		}
	}
	return k
}

// handlerIdentifier is what the watch handler's encoders' identifiers
// hold (k8s.io/apiserver's endpoints/handlers, response.go): JSON, with
// its name first.
type handlerIdentifier struct {
	Name            string `json:"name"`
	EmbeddedEncoder string `json:"embeddedEncoder"`
	Target          string `json:"target"`
	NoHeaders       bool   `json:"noHeaders"`
}

// handlerEncoderKind tells the watch handler's encoders by their
// identifiers, and encoderUnknown for any other.
func handlerEncoderKind(id runtime.Identifier) encoderKind {
	if !strings.HasPrefix(string(id), `{"name":"watch`) {
		return encoderUnknown
	}
	var h handlerIdentifier
	if err := json.Unmarshal([]byte(id), &h); err != nil {
		return encoderUnknown
	}
	switch h.Name {
	case "watch":
		if handlerEncoderKind(runtime.Identifier(h.EmbeddedEncoder)) == encoderUncached {
			return encoderWatchUncached
		}
		return encoderWatch
	case "watch-embedded":
		if strings.HasSuffix(h.Target, "Kind=Table") && !h.NoHeaders {
			return encoderUncached
		}
	}
	return encoderUnknown
}

func (c *Codec) learned(id runtime.Identifier, k encoderKind) {
	c.mu.Lock()
	c.encoders[id] = k
	c.mu.Unlock()
}

// rawFor reports whether the encoder id writes the cached bytes, learning
// it from o if it is not known: encode is that encoder.
func (c *Codec) rawFor(id runtime.Identifier, o *Object, encode func(runtime.Object, io.Writer) error) bool {
	switch c.kind(id) {
	case encoderRaw:
		return true
	case encoderUnknown:
		obj, err := o.Decode()
		if err != nil {
			return false
		}
		var buf bytes.Buffer
		if err := encode(obj, &buf); err != nil {
			return false
		}
		return c.compare(id, o, buf.Bytes())
	}
	return false
}

// compare learns whether the encoder id writes the cached bytes from what
// it wrote for o, and reports it.
func (c *Codec) compare(id runtime.Identifier, o *Object, encoded []byte) bool {
	k := encoderOther
	if bytes.Equal(encoded, o.Raw) {
		k = encoderRaw
	}
	c.learned(id, k)
	return k == encoderRaw
}
