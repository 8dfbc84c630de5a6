package object

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"time"
	"unsafe"

	jsoniter "github.com/json-iterator/go"
	"github.com/modern-go/reflect2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// stringDecoder decodes a JSON string into a Go string as jsoniter's own
// does (Iterator.ReadString), but finds a plain string's end with
// bytes.IndexByte instead of a loop over its bytes. That loop was a fifth
// of ours' CPU in a v1alpha1 list of 10 KiB objects, read from memory the
// processor had not cached.
//
// jsoniter does not expose where its Iterator is, so the decoder reads
// and moves the Iterator's head through the offsets of its fields, found
// by name and type when the package loads (iteratorLayout). If jsoniter's
// Iterator ever changes, they are not found and every string goes to
// ReadString, as before (TestPlainStrings fails first).
//
// A plain string is one with no escape and no control character, which
// is nearly every string the storage's encoder writes. Anything else, an
// escape, a control character (which ReadString reports as an error), a
// null or a string cut short, goes to ReadString.
//
// With share, for the cache's own bytes, a plain string is not copied: it
// is the bytes it lies in, which must then never change (see sharing). Nor
// are its bytes checked for control characters, which a JSON encoder
// always escapes: at 10 KiB that check was a quarter of a decode's time
// (BenchmarkDecode).
type stringDecoder struct{ share bool }

// Decode implements jsoniter.ValDecoder.
func (d stringDecoder) Decode(ptr unsafe.Pointer, iter *jsoniter.Iterator) {
	if s, ok := plainString(iter, d.share); ok {
		*(*string)(ptr) = s
		return
	}
	*(*string)(ptr) = iter.ReadString()
}

// plainString reads the plain string iter is at, if it is at one: a copy,
// or with share the input's own bytes.
func plainString(iter *jsoniter.Iterator, share bool) (string, bool) {
	if !layout.ok || iter.WhatIsNext() != jsoniter.StringValue {
		return "", false
	}
	// WhatIsNext left head at the opening quote.
	in, head := position(iter)
	s, n, ok := plainAt(in, share)
	*head += n
	return s, ok
}

// plainAt returns the plain string in begins with, and its length with
// its quotes, if in begins with one: a copy, or with share in's own bytes.
func plainAt(in []byte, share bool) (string, int, bool) {
	if len(in) == 0 || in[0] != '"' {
		return "", 0, false
	}
	rest := in[1:]
	n := bytes.IndexByte(rest, '"')
	if n < 0 || bytes.IndexByte(rest[:n], '\\') >= 0 || (!share && hasControl(rest[:n])) {
		return "", 0, false
	}
	if share && n > 0 {
		return unsafe.String(&rest[0], n), n + 2, true
	}
	return string(rest[:n]), n + 2, true
}

// stringMapDecoder decodes a map[string]string (labels, annotations) as
// jsoniter's own decoder does, but reads a compact map of plain strings
// where it lies (plainAt) and sets each entry in the map directly, where
// jsoniter allocates each key and value through reflection and sets them
// through reflection: the two maps every object holds were a third of a
// decode in a v1alpha1 list's profile (docs/benchmarks.md). Anything else
// goes to jsoniter's decoder, from where the map began; entries already
// set are set again.
type stringMapDecoder struct {
	share bool
	// jsoniter is jsoniter's own decoder of the type.
	jsoniter jsoniter.ValDecoder
}

// Decode implements jsoniter.ValDecoder.
func (d stringMapDecoder) Decode(ptr unsafe.Pointer, iter *jsoniter.Iterator) {
	if layout.ok && iter.WhatIsNext() == jsoniter.ObjectValue {
		// WhatIsNext left head at the opening brace.
		in, head := position(iter)
		if n, ok := d.plainMap((*map[string]string)(ptr), in); ok {
			*head += n
			return
		}
	}
	d.jsoniter.Decode(ptr, iter)
}

// plainMap sets the entries of the compact map of plain strings in begins
// with in *m, and returns the map's length, if in begins with one.
func (d stringMapDecoder) plainMap(m *map[string]string, in []byte) (int, bool) {
	if *m == nil {
		*m = map[string]string{}
	}
	i := 1
	if i < len(in) && in[i] == '}' {
		return i + 1, true
	}
	for {
		k, n, ok := plainAt(in[i:], d.share)
		if i += n; !ok || i >= len(in) || in[i] != ':' {
			return 0, false
		}
		v, n, ok := plainAt(in[i+1:], d.share)
		if i += 1 + n; !ok || i >= len(in) {
			return 0, false
		}
		(*m)[k] = v
		switch in[i] {
		case ',':
			i++
		case '}':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

// hasControl reports whether b holds a byte below 0x20, eight bytes at a
// time. Taking 0x20 from every byte sets the top bit of each byte below
// 0x20, and masking with the word's complement drops the bytes whose own
// top bit was set. A borrow can set a bit only above a byte below 0x20,
// so a bit is left exactly when there is one.
func hasControl(b []byte) bool {
	const ones, highs = 0x2020202020202020, 0x8080808080808080
	for len(b) >= 8 {
		x := binary.LittleEndian.Uint64(b)
		if (x-ones)&^x&highs != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// position returns what iter has yet to read of its input, and its head,
// the index in its input where that begins. layout.ok must hold.
func position(iter *jsoniter.Iterator) (in []byte, head *int) {
	p := unsafe.Pointer(iter)
	buf := *(*[]byte)(unsafe.Add(p, layout.buf))
	head = (*int)(unsafe.Add(p, layout.head))
	return buf[*head:*(*int)(unsafe.Add(p, layout.tail))], head
}

// iteratorLayout is where a jsoniter Iterator keeps its input and its
// position in it.
type iteratorLayout struct {
	buf, head, tail uintptr
	// ok is whether all three were found with the types expected.
	ok bool
}

var layout = func() iteratorLayout {
	t := reflect.TypeFor[jsoniter.Iterator]()
	field := func(name string, want reflect.Type) (uintptr, bool) {
		f, ok := t.FieldByName(name)
		return f.Offset, ok && f.Type == want
	}
	var l iteratorLayout
	var okBuf, okHead, okTail bool
	l.buf, okBuf = field("buf", reflect.TypeFor[[]byte]())
	l.head, okHead = field("head", reflect.TypeFor[int]())
	l.tail, okTail = field("tail", reflect.TypeFor[int]())
	l.ok = okBuf && okHead && okTail
	return l
}()

// timeDecoder decodes a metav1.Time written as a plain string as its
// UnmarshalJSON does, without copying the string out and decoding it
// again with encoding/json: a third of the allocations of a decode went to
// the two times every object holds. Anything else goes to UnmarshalJSON.
type timeDecoder struct{}

// Decode implements jsoniter.ValDecoder.
func (timeDecoder) Decode(ptr unsafe.Pointer, iter *jsoniter.Iterator) {
	t := (*metav1.Time)(ptr)
	// The string is not kept: time.Parse copies what it keeps of its input
	// (a zone's name), so it may share the input's bytes; and it rejects a
	// control character, which sharing does not look for, as the
	// serializer does.
	if s, ok := plainString(iter, true); ok {
		pt, err := time.Parse(time.RFC3339, s)
		if err != nil {
			iter.ReportError("decoding a metav1.Time", err.Error())
			return
		}
		t.Time = pt.Local()
		return
	}
	if err := t.UnmarshalJSON(iter.SkipAndReturnBytes()); err != nil {
		iter.ReportError("decoding a metav1.Time", err.Error())
	}
}

// fieldsDecoder decodes a metav1.FieldsV1, a managedFields entry's field
// set, as its UnmarshalJSON does: a copy of the JSON object it is at. It
// finds the object's end by matching brackets outside strings, where
// jsoniter's skip, which hands UnmarshalJSON the object, reads each key of
// the set into a new string. The object is not checked: the cache decodes
// its own bytes, which the storage's encoder wrote, and the storage codec
// keeps a decode only if it encodes back to the bytes etcd holds, which
// encoding/json checks a FieldsV1's bytes to be JSON for. Anything else,
// null or an object cut short, goes to UnmarshalJSON.
type fieldsDecoder struct{}

// Decode implements jsoniter.ValDecoder.
func (fieldsDecoder) Decode(ptr unsafe.Pointer, iter *jsoniter.Iterator) {
	f := (*metav1.FieldsV1)(ptr)
	if raw, ok := jsonObject(iter); ok {
		f.Raw = append(f.Raw[:0], raw...)
		return
	}
	if err := f.UnmarshalJSON(iter.SkipAndReturnBytes()); err != nil {
		iter.ReportError("decoding a metav1.FieldsV1", err.Error())
	}
}

// jsonObject returns the JSON object iter is at, and moves past it, if
// iter is at one that ends in its input.
func jsonObject(iter *jsoniter.Iterator) ([]byte, bool) {
	if !layout.ok || iter.WhatIsNext() != jsoniter.ObjectValue {
		return nil, false
	}
	// WhatIsNext left head at the opening brace.
	in, head := position(iter)
	depth := 0
	for i := 0; i < len(in); i++ {
		switch in[i] {
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				*head += i + 1
				return in[:i+1], true
			}
		case '"':
			// On to the string's closing quote, past escaped characters.
			for i++; i < len(in) && in[i] != '"'; i++ {
				if in[i] == '\\' {
					i++
				}
			}
		}
	}
	return nil, false
}

// plainStrings is the jsoniter extension that gives every string type
// stringDecoder, sharing its input's bytes with share, except those that
// decode themselves and json.Number, which jsoniter decodes from a number;
// metav1.Time timeDecoder, and metav1.FieldsV1 fieldsDecoder. A field set
// is always copied: it is a []byte, which its holder may change.
type plainStrings struct {
	jsoniter.DummyExtension
	share bool
}

var (
	timeType      = reflect2.TypeOf(metav1.Time{})
	fieldsType    = reflect2.TypeOf(metav1.FieldsV1{})
	stringMapType = reflect2.TypeOf(map[string]string{})
)

var (
	jsonUnmarshaler = reflect2.TypeOfPtr((*json.Unmarshaler)(nil)).Elem()
	textUnmarshaler = reflect2.TypeOfPtr((*interface{ UnmarshalText([]byte) error })(nil)).Elem()
	numberTypes     = []reflect2.Type{reflect2.TypeOf(json.Number("")), reflect2.TypeOf(jsoniter.Number(""))}
)

// DecorateDecoder implements jsoniter.Extension: a map[string]string
// takes stringMapDecoder, with jsoniter's own decoder for anything else.
func (p *plainStrings) DecorateDecoder(typ reflect2.Type, decoder jsoniter.ValDecoder) jsoniter.ValDecoder {
	if typ == stringMapType {
		return stringMapDecoder{share: p.share, jsoniter: decoder}
	}
	return decoder
}

// CreateDecoder implements jsoniter.Extension.
func (p *plainStrings) CreateDecoder(typ reflect2.Type) jsoniter.ValDecoder {
	switch typ {
	case timeType:
		return timeDecoder{}
	case fieldsType:
		return fieldsDecoder{}
	}
	if typ.Kind() != reflect.String {
		return nil
	}
	ptr := reflect2.PtrTo(typ)
	if ptr.Implements(jsonUnmarshaler) || ptr.Implements(textUnmarshaler) {
		return nil
	}
	for _, n := range numberTypes {
		if typ == n {
			return nil
		}
	}
	return stringDecoder{share: p.share}
}
