package object

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	jsoniter "github.com/json-iterator/go"
	"github.com/modern-go/reflect2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	sigsjson "sigs.k8s.io/json"
)

// stringFields is what plainStrings decodes, and what it must leave alone.
type stringFields struct {
	S    string            `json:"s"`
	UID  types.UID         `json:"uid,omitempty"`
	M    map[string]string `json:"m,omitempty"`
	L    []string          `json:"l,omitempty"`
	T    metav1.Time       `json:"t"`
	P    *metav1.Time      `json:"p,omitempty"`
	N    json.Number       `json:"n,omitempty"`
	Text textString        `json:"text,omitempty"`
	F    metav1.FieldsV1   `json:"f"`
	FP   *metav1.FieldsV1  `json:"fp,omitempty"`
}

// textString decodes itself, so plainStrings leaves it to jsoniter.
type textString string

func (s *textString) UnmarshalText(b []byte) error {
	*s = textString("text:" + string(b))
	return nil
}

// TestPlainStrings decodes with jsoniter as the cache does, and with the
// storage serializer's decoder, and wants the same value, or an error
// from both. The one deliberate difference: sharing does not look for raw
// control characters, which no JSON encoder writes, and so the cache's own
// bytes never hold; it decodes them as they are.
func TestPlainStrings(t *testing.T) {
	if !layout.ok {
		t.Fatal("jsoniter's Iterator has changed: every string goes to ReadString")
	}
	tests := []struct {
		name, json string
		// control is whether a string holds a raw control character.
		control bool
	}{
		{name: "plain", json: `{"s":"abc","uid":"u-1","m":{"k":"v","":""},"l":["x","y"],"t":"2026-11-26T08:00:00Z"}`},
		{name: "empty", json: `{"s":"","t":null}`},
		{name: "non-ASCII and separators", json: "{\"s\":\"é🚀\u2028\",\"t\":null}"},
		{name: "an escaped quote", json: `{"s":"a\"b","m":{"k\"":"v\""},"t":null}`},
		{name: "an escaped backslash before the end", json: `{"s":"a\\","l":["\\"],"t":null}`},
		{name: "unicode escapes", json: `{"s":"\u003cb\u003e\u2028","t":null}`},
		{name: "a control character", json: "{\"s\":\"a\x01b\",\"t\":null}", control: true},
		{name: "a tab", json: "{\"s\":\"a\tb\",\"t\":null}", control: true},
		{name: "a control character after the first 8 bytes", json: "{\"s\":\"abcdefghij\x1f\",\"t\":null}", control: true},
		{name: "a control character in the first 8 bytes of 10", json: "{\"s\":\"\x01bcdefghij\",\"t\":null}", control: true},
		{name: "null string", json: `{"s":null,"t":null}`},
		{name: "whitespace", json: "{ \"s\" : \"a\" , \"t\" :\n\"2026-11-26T08:00:00+02:00\" }"},
		{name: "unterminated", json: `{"s":"abc`},
		{name: "a number for a string", json: `{"s":1,"t":null}`},
		{name: "a time", json: `{"s":"","t":"2026-11-26T08:00:00Z","p":"2026-01-02T03:04:05.5+01:00"}`},
		{name: "a null time pointer", json: `{"s":"","t":null,"p":null}`},
		{name: "an escaped time", json: `{"s":"","t":"2026-11-26T08:00:00\u005a"}`},
		{name: "a time that is not RFC 3339", json: `{"s":"","t":"yesterday"}`},
		{name: "a time as a number", json: `{"s":"","t":5}`},
		// Both configs' time decoder reads it without looking for control
		// characters; time.Parse rejects it.
		{name: "a control character in a time", json: "{\"s\":\"\",\"t\":\"2026-11-26T08:00:00\x01Z\"}"},
		{name: "json.Number", json: `{"s":"","t":null,"n":12.5}`},
		{name: "a type that decodes itself", json: `{"s":"","t":null,"text":"x"}`},
		{name: "a field set", json: `{"s":"","t":null,"f":{"f:metadata":{"f:labels":{".":{},"f:a":{}}},"f:spec":{"f:x":{}}},"fp":{}}`},
		{name: "brackets and quotes in a field set's keys", json: `{"s":"","t":null,"f":{"k:{\"type\":\"}\"}":{"]":{}},"v:\"a\\\"":{}},"fp":{"f:[{":{}}}`},
		{name: "a null field set", json: `{"s":"","t":null,"f":null,"fp":null}`},
		{name: "a field set that is not an object", json: `{"s":"","t":null,"f":["f:a"],"fp":"x"}`},
		{name: "a field set cut short", json: `{"s":"","t":null,"f":{"f:a":{}`},
		{name: "a field set after whitespace", json: "{\"s\":\"\",\"t\":null,\"f\": \n{ \"f:a\" : {} } }"},
		{name: "an empty map", json: `{"s":"","t":null,"m":{}}`},
		{name: "a null map", json: `{"s":"","t":null,"m":null}`},
		{name: "a map with whitespace", json: "{\"s\":\"\",\"t\":null,\"m\": { \"a\" : \"b\" ,\"c\":\"d\"}}"},
		{name: "a map with a key twice", json: `{"s":"","t":null,"m":{"a":"1","b":"2","a":"3"}}`},
		{name: "a map with an escape after a plain entry", json: `{"s":"","t":null,"m":{"a":"1","b":"\u003c"}}`},
		{name: "a map with a number", json: `{"s":"","t":null,"m":{"a":1}}`},
		{name: "a map with a null", json: `{"s":"","t":null,"m":{"a":null}}`},
		{name: "a map cut short", json: `{"s":"","t":null,"m":{"a":"b"`},
		{name: "a map with a control character", json: "{\"s\":\"\",\"t\":null,\"m\":{\"a\":\"\x01\"}}", control: true},
	}
	for _, api := range []struct {
		name string
		api  jsoniter.API
	}{{"copied", caseSensitive}, {"shared", sharing}} {
		for _, tt := range tests {
			t.Run(api.name+"/"+tt.name, func(t *testing.T) {
				var got, want stringFields
				gotErr := api.api.Unmarshal([]byte(tt.json), &got)
				wantErr := sigsjson.UnmarshalCaseSensitivePreserveInts([]byte(tt.json), &want)
				if tt.control && api.api == sharing {
					if wantErr == nil || gotErr != nil || !strings.ContainsFunc(got.S+got.M["a"], func(r rune) bool { return r < 0x20 }) {
						t.Fatalf("shared: %v, %q and %q; the serializer's decoder: %v; want the raw control character kept", gotErr, got.S, got.M, wantErr)
					}
					return
				}
				if (gotErr != nil) != (wantErr != nil) {
					t.Fatalf("jsoniter: %v; the serializer's decoder: %v", gotErr, wantErr)
				}
				if wantErr == nil && !reflect.DeepEqual(got, want) {
					t.Fatalf("jsoniter decoded\n%#v\nthe serializer's decoder\n%#v", got, want)
				}
			})
		}
	}
}

// TestPlainString checks which strings take the fast path, that the
// iterator goes on after them, and that they share the input's bytes only
// when asked to.
func TestPlainString(t *testing.T) {
	tests := []struct {
		json, want string
		ok         bool
		// control: shared, the string is read as it is.
		control bool
	}{
		{json: `"abc",1`, want: "abc", ok: true},
		{json: ` "",1`, want: "", ok: true},
		{json: "\"é\u2028🚀\",1", want: "é\u2028🚀", ok: true},
		{json: `"a\"b",1`},
		{json: `"a\\",1`},
		// Shared, a control character is the cache's bytes' as they are
		// (TestPlainStrings).
		{json: "\"a\x1fb\",1", want: "a\x1fb", control: true},
		{json: `null,1`},
		{json: `"abc`},
	}
	for _, share := range []bool{false, true} {
		for _, tt := range tests {
			in := []byte(tt.json)
			iter := caseSensitive.BorrowIterator(in)
			got, ok := plainString(iter, share)
			want, wantOK := tt.want, tt.ok || (share && tt.control)
			if !wantOK {
				want = ""
			}
			if got != want || ok != wantOK {
				t.Errorf("plainString(%q, %v) = %q, %v; want %q, %v", tt.json, share, got, ok, want, wantOK)
			}
			if got != "" && within(unsafe.StringData(got), in) != share {
				t.Errorf("plainString(%q, %v) shares the input: %v", tt.json, share, !share)
			}
			if !ok {
				// ReadString decodes it, from where it began.
				iter.ReadString()
			}
			if rest, _ := position(iter); iter.Error == nil && string(rest) != ",1" {
				t.Errorf("after %q, the iterator is at %q, want \",1\"", tt.json, rest)
			}
			caseSensitive.ReturnIterator(iter)
		}
	}
}

// TestPlainMap checks which maps stringMapDecoder reads where they lie,
// that those share the input's bytes only when asked to, and that the
// iterator goes on after every map, read there or by jsoniter.
func TestPlainMap(t *testing.T) {
	tests := []struct {
		json string
		want map[string]string
		// plain is whether the map is read where it lies.
		plain bool
	}{
		{json: `{"a":"b","":"","c":"d"},1`, want: map[string]string{"a": "b", "": "", "c": "d"}, plain: true},
		{json: `{},1`, want: map[string]string{}, plain: true},
		{json: ` {"a":"b"},1`, want: map[string]string{"a": "b"}, plain: true},
		{json: `{"a":"b" },1`, want: map[string]string{"a": "b"}},
		{json: `{"a":"\u003c"},1`, want: map[string]string{"a": "<"}},
		{json: `null,1`},
	}
	for _, share := range []bool{false, true} {
		api := caseSensitive
		if share {
			api = sharing
		}
		d, ok := api.DecoderOf(reflect2.TypeOf(&map[string]string{})).(stringMapDecoder)
		if !ok {
			t.Fatalf("jsoniter decodes a map[string]string with %T, want stringMapDecoder", d)
		}
		var fellBack bool
		d.jsoniter = fallbackRecorder{d.jsoniter, &fellBack}
		for _, tt := range tests {
			in := []byte(tt.json)
			iter := api.BorrowIterator(in)
			var got map[string]string
			fellBack = false
			d.Decode(unsafe.Pointer(&got), iter)
			if fellBack == tt.plain {
				t.Errorf("%q went to jsoniter's decoder: %v, want %v", tt.json, fellBack, !tt.plain)
			}
			if rest, _ := position(iter); iter.Error != nil || string(rest) != ",1" {
				t.Errorf("after %q: %v, the iterator is at %q, want \",1\"", tt.json, iter.Error, rest)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("decoded %q to %v, want %v", tt.json, got, tt.want)
			}
			api.ReturnIterator(iter)
			if !tt.plain {
				continue
			}
			for k, v := range got {
				for _, s := range []string{k, v} {
					if s != "" && within(unsafe.StringData(s), in) != share {
						t.Errorf("%q, shared %v: %q lies in the input: %v", tt.json, share, s, !share)
					}
				}
			}
		}
	}
}

// fallbackRecorder is a decoder that records that it was called.
type fallbackRecorder struct {
	jsoniter.ValDecoder
	called *bool
}

func (r fallbackRecorder) Decode(ptr unsafe.Pointer, iter *jsoniter.Iterator) {
	*r.called = true
	r.ValDecoder.Decode(ptr, iter)
}

// within reports whether p points into b.
func within(p *byte, b []byte) bool {
	at := uintptr(unsafe.Pointer(p))
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return at >= start && at < start+uintptr(len(b))
}

// TestJSONObject checks where jsonObject finds an object's end, and that
// the iterator goes on after it.
func TestJSONObject(t *testing.T) {
	tests := []struct {
		json, want string
		ok         bool
	}{
		{json: `{},1`, want: `{}`, ok: true},
		{json: ` {"a":{"b":[1,{}]}},1`, want: `{"a":{"b":[1,{}]}}`, ok: true},
		{json: `{"}":"{","]":"\"}"},1`, want: `{"}":"{","]":"\"}"}`, ok: true},
		{json: `{"a\\":"\\"},1`, want: `{"a\\":"\\"}`, ok: true},
		{json: `{"a":"}`},
		{json: `{"a":{}`},
		{json: `[{}],1`},
		{json: `null,1`},
	}
	for _, tt := range tests {
		iter := caseSensitive.BorrowIterator([]byte(tt.json))
		got, ok := jsonObject(iter)
		if string(got) != tt.want || ok != tt.ok {
			t.Errorf("jsonObject(%q) = %q, %v; want %q, %v", tt.json, got, ok, tt.want, tt.ok)
		}
		if rest, _ := position(iter); ok && string(rest) != ",1" {
			t.Errorf("after %q, the iterator is at %q, want \",1\"", tt.json, rest)
		}
		caseSensitive.ReturnIterator(iter)
	}
}

// TestHasControl checks the eight-bytes-at-a-time test against a byte
// at a time, for every byte value at every position of a word and of
// the tail.
func TestHasControl(t *testing.T) {
	for n := range 20 {
		for at := range n {
			for c := range 256 {
				b := []byte("abcdefghijklmnopqrst"[:n])
				b[at] = byte(c)
				if got, want := hasControl(b), c < 0x20; got != want {
					t.Fatalf("hasControl(%q) = %v, want %v", b, got, want)
				}
			}
		}
	}
}
