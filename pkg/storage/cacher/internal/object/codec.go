package object

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/versioning"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/compress"
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
	// compression reads the objects' compressed bytes, and corrupt is told
	// of those that do not decompress (BuilderConfig.Compression, Corrupt).
	compression *compress.Codec
	corrupt     func(*Object, error)

	// mu guards encoders and events.
	mu       sync.RWMutex
	encoders map[runtime.Identifier]encoderKind
	// events are the watch encoders known to write an event as a frame
	// around its object's bytes (learnEvent): the frame's start by encoder,
	// nil for one that does not.
	events map[runtime.Identifier][]byte
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

func newCodec(cfg BuilderConfig) *Codec {
	codec, scheme := cfg.Codec, cfg.Scheme
	c := &Codec{codec: codec, newFunc: cfg.NewFunc, expiry: cfg.Expiry, compression: cfg.Compression, corrupt: cfg.Corrupt,
		encoders: map[runtime.Identifier]encoderKind{}, events: map[runtime.Identifier][]byte{}}
	if scheme != nil {
		// As the storage's codec decodes (k8s.io/apiserver's storage codec:
		// JSON, not strict, defaulted, converted into the caller's type), but
		// with the type taken from the header the cache's own bytes begin
		// with, and unmarshalled in one pass (jsonDecoder).
		c.decoder = versioning.NewDefaultingCodecForScheme(scheme, nil, newJSONDecoder(scheme, true), nil, runtime.InternalGroupVersioner)
	}
	return c
}

// decode decodes o's bytes into into: with decoder if they are JSON with
// a type header, else with the storage's codec. Compressed bytes are
// decompressed into an array of their own, which the decoded strings
// share (decodeExact), as they share the bytes the object holds otherwise.
func (c *Codec) decode(o *Object, into runtime.Object) (runtime.Object, error) {
	d := runtime.Decoder(c.codec)
	if c.decoder != nil && o.Head > 0 {
		d = c.decoder
	}
	raw, err := o.Bytes(nil)
	if err != nil {
		return nil, err
	}
	out, _, err := d.Decode(raw, nil, into)
	return out, err
}

// Compression is the codec the objects' bytes are compressed with, nil
// where they are not (BuilderConfig.Compression).
func (c *Codec) Compression() *compress.Codec { return c.compression }

// corrupted tells the cache that o's bytes did not decompress.
func (c *Codec) corrupted(o *Object, err error) {
	if c.corrupt != nil {
		c.corrupt(o, err)
	}
}

// headerMeta finds the type of the cache's bytes in their type header,
// without the whole-document parse of json.DefaultMetaFactory: that parse is
// nearly half of a decode's time. It is exact for bytes the storage's
// encoder wrote, which have each key once; other bytes, which the cache does
// not keep, could name their type again after the header, and
// DefaultMetaFactory would read the last.
//
// A cache's objects nearly all begin with one header, so it keeps the last
// header it parsed and the type it named: parsing the group version again
// for every object was a tenth of a decode (v1alpha1 lists' CPU profile).
type headerMeta struct {
	last atomic.Pointer[parsedHeader]
}

// parsedHeader is a type header and the type it names.
type parsedHeader struct {
	header []byte
	gvk    schema.GroupVersionKind
}

func (m *headerMeta) Interpret(data []byte) (*schema.GroupVersionKind, error) {
	kind, apiVersion, n := parseTypeHeader(data)
	if n == 0 {
		return nil, fmt.Errorf("no type header in the cached bytes")
	}
	if last := m.last.Load(); last != nil && bytes.Equal(last.header, data[:n]) {
		gvk := last.gvk // a copy: the serializer writes into what it is given
		return &gvk, nil
	}
	gv, err := schema.ParseGroupVersion(string(apiVersion))
	if err != nil {
		return nil, err
	}
	gvk := gv.WithKind(string(kind))
	m.last.Store(&parsedHeader{header: bytes.Clone(data[:n]), gvk: gvk})
	return &gvk, nil
}

// Encode returns obj's bytes: its encoding, in a slice of its own length.
func (c *Codec) Encode(obj runtime.Object) ([]byte, error) { return c.encode(obj, 0) }

// encode is Encode with room for that many bytes more in the slice's
// capacity.
func (c *Codec) encode(obj runtime.Object, room int) ([]byte, error) {
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
	return append(make([]byte, 0, buf.Len()+room), buf.Bytes()...), nil
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
	EventType       string `json:"eventType"`
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

// eventStart returns the start of the frame the watch encoder id is known to
// write around an object's bytes, and whether it is known to.
func (c *Codec) eventStart(id runtime.Identifier) ([]byte, bool) {
	c.mu.RLock()
	start := c.events[id]
	c.mu.RUnlock()
	return start, start != nil
}

// learnEvent learns whether the watch encoder id writes an event as
// appendEvent does, from what it wrote for o's.
//
// The watch handler's encoder writes a metav1.WatchEvent in JSON: the
// event's type, then what its embedded encoder wrote for the object, which
// encoding/json compacts, and a newline. Where the embedded encoder writes
// the cached bytes (encoderRaw), which are that same encoder's compact
// output, the event is the same frame around them for every object, so
// one object shows it, as one shows an encoderRaw. Anything else (another
// serializer, a Table, pretty output) differs, and is encoded.
func (c *Codec) learnEvent(id runtime.Identifier, o *Object, encoded []byte) {
	c.mu.RLock()
	_, known := c.events[id]
	c.mu.RUnlock()
	if known {
		return
	}
	var start []byte
	var h handlerIdentifier
	if err := json.Unmarshal([]byte(id), &h); err == nil && c.kind(runtime.Identifier(h.EmbeddedEncoder)) == encoderRaw {
		t, _ := json.Marshal(h.EventType)
		guess := slices.Concat([]byte(`{"type":`), t, []byte(`,"object":`))
		if ev, err := appendEvent(nil, guess, o); err == nil && bytes.Equal(ev, encoded) {
			start = guess
		}
	}
	c.mu.Lock()
	c.events[id] = start // another learner's answer is the same
	c.mu.Unlock()
}

// appendEvent appends to b the watch event whose frame begins with start,
// of o, whose bytes are decompressed into b where they are compressed.
func appendEvent(b, start []byte, o *Object) ([]byte, error) {
	b = append(b, start...)
	b, err := o.AppendBytes(b)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	return append(b, "}\n"...), nil
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
	raw, err := o.Bytes(nil)
	if err != nil {
		return false // nothing learnt from a corrupt object
	}
	k := encoderOther
	if bytes.Equal(encoded, raw) {
		k = encoderRaw
	}
	c.learned(id, k)
	return k == encoderRaw
}
