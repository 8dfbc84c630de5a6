package apiserver

import (
	"bytes"
	"encoding/json"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// watchEventEncoder is the JSON stream serializer with the watch event's
// frame written directly around its object. The watch handler encodes
// each event's object with the JSON serializer, then the event around it
// as a metav1.WatchEvent with the object as raw JSON, and encoding/json
// compacts raw JSON it embeds: it runs its scanner over every byte of the
// object again, for output that is the same bytes. That rescan was a
// quarter of the server's CPU while watch-lists streamed 100,000 objects
// (docs/benchmarks.md); upstream's servers pay it too.
//
// The frame written is byte for byte encoding/json's
// (TestWatchEventEncoderMatchesJSON). It applies only to an object as the
// JSON serializer writes it, compact, with one newline after it; any
// other event goes to the serializer as before.
type watchEventEncoder struct {
	runtime.Serializer
}

// Encode implements runtime.Encoder.
func (e watchEventEncoder) Encode(obj runtime.Object, w io.Writer) error {
	ev, ok := obj.(*metav1.WatchEvent)
	if !ok {
		return e.Serializer.Encode(obj, w)
	}
	raw, ok := compactJSONObject(ev.Object.Raw)
	if !ok {
		return e.Serializer.Encode(obj, w)
	}
	typ, ok := quotedEventTypes[ev.Type]
	if !ok {
		var err error
		if typ, err = json.Marshal(ev.Type); err != nil {
			return err
		}
	}
	// In pieces, not copied: the watch handler hands its encoder a buffer.
	for _, b := range [][]byte{frameStart, typ, frameObject, raw, frameEnd} {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// The frame of a watch event, as encoding/json writes a metav1.WatchEvent.
var (
	frameStart  = []byte(`{"type":`)
	frameObject = []byte(`,"object":`)
	frameEnd    = []byte("}\n")
	// quotedEventTypes are the event types in JSON.
	quotedEventTypes = func() map[string][]byte {
		m := map[string][]byte{}
		for _, t := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted, watch.Bookmark, watch.Error} {
			m[string(t)] = []byte(`"` + t + `"`)
		}
		return m
	}()
)

// compactJSONObject returns raw without its final newline if raw is a JSON
// object as encoding/json's Encoder writes one: compact, escaped for HTML,
// with a newline after it. Compacting that as encoding/json does for raw
// JSON it embeds changes nothing but the newline. It returns false for
// anything compacting would change: whitespace outside strings, and the
// characters escaped for HTML (<, >, & and U+2028, U+2029). It does not
// check the grammar: the JSON serializer wrote raw, and encoding/json
// writes only valid JSON.
func compactJSONObject(raw []byte) ([]byte, bool) {
	body, ok := bytes.CutSuffix(raw, []byte("\n"))
	if !ok || len(body) < 2 || body[0] != '{' || body[len(body)-1] != '}' {
		return nil, false
	}
	inString := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !notable[c] {
			continue
		}
		switch c {
		case '"':
			inString = !inString
		case '\\':
			i++ // the escaped character, which may be a quote
		case ' ':
			if !inString {
				return nil, false
			}
		case 0xE2:
			if i+2 < len(body) && body[i+1] == 0x80 && body[i+2]&^1 == 0xA8 {
				return nil, false
			}
		default: // \t, \r, \n: whitespace outside strings, as JSON has none raw inside; <, >, &
			return nil, false
		}
	}
	return body, true
}

// notable marks the bytes compactJSONObject looks at.
var notable = func() (t [256]bool) {
	for _, c := range []byte("\"\\ \t\r\n<>&\xe2") {
		t[c] = true
	}
	return t
}()

// withWatchEventEncoder gives the JSON stream serializer of infos a
// watchEventEncoder.
func withWatchEventEncoder(infos []runtime.SerializerInfo) []runtime.SerializerInfo {
	for i, info := range infos {
		if info.MediaType != runtime.ContentTypeJSON || info.StreamSerializer == nil {
			continue
		}
		stream := *info.StreamSerializer
		stream.Serializer = watchEventEncoder{stream.Serializer}
		infos[i].StreamSerializer = &stream
	}
	return infos
}
