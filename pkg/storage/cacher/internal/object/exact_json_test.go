package object

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	sigsjson "sigs.k8s.io/json"
)

// stringFields is what decodeExact decodes.
type stringFields struct {
	S   string            `json:"s"`
	UID types.UID         `json:"uid,omitempty"`
	M   map[string]string `json:"m,omitempty"`
	L   []string          `json:"l,omitempty"`
	T   metav1.Time       `json:"t"`
	P   *metav1.Time      `json:"p,omitempty"`
	F   metav1.FieldsV1   `json:"f"`
	FP  *metav1.FieldsV1  `json:"fp,omitempty"`
}

// TestExactDecoder decodes with decodeExact, and with the storage
// serializer's decoder, and wants the same value, or an error from both.
// Where decodeExact errs alone (fallback: what the encoder never writes),
// the cache decodes with the serializer instead (TestDecoderFallsBack).
func TestExactDecoder(t *testing.T) {
	tests := []struct {
		name, json string
		// fallback: decodeExact errs, the serializer does not.
		fallback bool
	}{
		{name: "plain", json: `{"s":"abc","uid":"u-1","m":{"k":"v","":""},"l":["x","y"],"t":"2026-11-26T08:00:00Z"}`},
		{name: "empty", json: `{"s":"","t":null}`},
		{name: "non-ASCII and separators", json: "{\"s\":\"é🚀\u2028\",\"t\":null}"},
		{name: "an escaped quote", json: `{"s":"a\"b","m":{"k\"":"v\""},"t":null}`},
		{name: "an escaped backslash before the end", json: `{"s":"a\\","l":["\\"],"t":null}`},
		{name: "unicode escapes", json: `{"s":"\u003cb\u003e\u2028","t":null}`},
		{name: "a control character", json: "{\"s\":\"a\x01b\",\"t\":null}"},
		{name: "a tab", json: "{\"s\":\"a\tb\",\"t\":null}"},
		{name: "a control character after the first 8 bytes", json: "{\"s\":\"abcdefghij\x1f\",\"t\":null}"},
		{name: "a control character in the first 8 bytes of 10", json: "{\"s\":\"\x01bcdefghij\",\"t\":null}"},
		{name: "null string", json: `{"s":null,"t":null}`},
		{name: "whitespace", json: "{ \"s\" : \"a\" , \"t\" :\n\"2026-11-26T08:00:00+02:00\" }", fallback: true},
		{name: "unterminated", json: `{"s":"abc`},
		{name: "a number for a string", json: `{"s":1,"t":null}`},
		{name: "a time", json: `{"s":"","t":"2026-11-26T08:00:00Z","p":"2026-01-02T03:04:05.5+01:00"}`},
		{name: "a null time pointer", json: `{"s":"","t":null,"p":null}`},
		{name: "an escaped time", json: `{"s":"","t":"2026-11-26T08:00:00\u005a"}`, fallback: true},
		{name: "a time that is not RFC 3339", json: `{"s":"","t":"yesterday"}`},
		{name: "a time as a number", json: `{"s":"","t":5}`},
		// The time decoder reads it without looking for control characters;
		// the parse rejects it.
		{name: "a control character in a time", json: "{\"s\":\"\",\"t\":\"2026-11-26T08:00:00\x01Z\"}"},
		{name: "a field set", json: `{"s":"","t":null,"f":{"f:metadata":{"f:labels":{".":{},"f:a":{}}},"f:spec":{"f:x":{}}},"fp":{}}`},
		{name: "brackets and quotes in a field set's keys", json: `{"s":"","t":null,"f":{"k:{\"type\":\"}\"}":{"]":{}},"v:\"a\\\"":{}},"fp":{"f:[{":{}}}`},
		{name: "a null field set", json: `{"s":"","t":null,"f":null,"fp":null}`},
		{name: "a field set that is not an object", json: `{"s":"","t":null,"f":["f:a"],"fp":"x"}`},
		{name: "a field set cut short", json: `{"s":"","t":null,"f":{"f:a":{}`},
		{name: "a field set after whitespace", json: "{\"s\":\"\",\"t\":null,\"f\": \n{ \"f:a\" : {} } }", fallback: true},
		{name: "an empty map", json: `{"s":"","t":null,"m":{}}`},
		{name: "a null map", json: `{"s":"","t":null,"m":null}`},
		{name: "a map with whitespace", json: "{\"s\":\"\",\"t\":null,\"m\": { \"a\" : \"b\" ,\"c\":\"d\"}}", fallback: true},
		{name: "a map with a key twice", json: `{"s":"","t":null,"m":{"a":"1","b":"2","a":"3"}}`},
		{name: "a map with an escape after a plain entry", json: `{"s":"","t":null,"m":{"a":"1","b":"\u003c"}}`},
		{name: "a map with a number", json: `{"s":"","t":null,"m":{"a":1}}`},
		{name: "a map with a null", json: `{"s":"","t":null,"m":{"a":null}}`},
		{name: "a map cut short", json: `{"s":"","t":null,"m":{"a":"b"`},
		{name: "a map with a control character", json: "{\"s\":\"\",\"t\":null,\"m\":{\"a\":\"\x01\"}}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { decodesAsSerializer[stringFields](t, tt.json, tt.fallback) })
	}
}

// decodesAsSerializer checks that decodeExact decodes data into a T as
// the serializer's decoder does, error for error; or, with fallback, that
// decodeExact alone refuses it, leaving it to the serializer.
func decodesAsSerializer[T any](t *testing.T, data string, fallback bool) {
	t.Helper()
	var got, want T
	gotErr := decodeExact([]byte(data), &got, false)
	wantErr := sigsjson.UnmarshalCaseSensitivePreserveInts([]byte(data), &want)
	if fallback {
		if gotErr == nil || wantErr != nil {
			t.Fatalf("decodeExact: %v; the serializer's decoder: %v; want decodeExact alone to fail", gotErr, wantErr)
		}
		return
	}
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("decodeExact: %v; the serializer's decoder: %v", gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("decodeExact decoded\n%#v\nthe serializer's decoder\n%#v", got, want)
	}
}

// Embedded is inlined into exactKinds, as TypeMeta is into every object.
type Embedded struct {
	Kind string `json:"kind,omitempty"`
}

// exactKinds is every other kind decodeExact decodes.
type exactKinds struct {
	Embedded `json:",inline"`
	I        int                 `json:"i,omitempty"`
	I8       int8                `json:"i8,omitempty"`
	U        uint32              `json:"u,omitempty"`
	F        float64             `json:"f,omitempty"`
	B        bool                `json:"b,omitempty"`
	P        *int64              `json:"p,omitempty"`
	PS       *exactKinds         `json:"ps,omitempty"`
	L        []int               `json:"l,omitempty"`
	LS       []Embedded          `json:"ls,omitempty"`
	Bytes    []byte              `json:"bytes,omitempty"`
	MS       map[string][]string `json:"ms,omitempty"`
	Named    types.UID           `json:"named,omitempty"`
	Untagged string
}

// TestExactDecoderKinds is TestExactDecoder over every other kind.
func TestExactDecoderKinds(t *testing.T) {
	tests := []struct {
		name, json string
		fallback   bool
	}{
		{name: "ints", json: `{"i":-12,"i8":127,"u":4294967295,"p":9223372036854775807}`},
		{name: "the smallest int64", json: `{"p":-9223372036854775808}`},
		{name: "an int8 too large", json: `{"i8":128}`},
		{name: "a uint too large", json: `{"u":4294967296}`},
		{name: "an int64 too large", json: `{"p":9223372036854775808}`},
		{name: "a negative uint", json: `{"u":-1}`},
		{name: "a leading zero", json: `{"i":012}`},
		{name: "minus zero", json: `{"i":-0}`},
		{name: "a float for an int", json: `{"i":1.5}`},
		{name: "an exponent for an int", json: `{"i":1e3}`},
		{name: "floats", json: `{"f":-1.5e-3}`},
		{name: "a float that is not a number", json: `{"f":1.}`},
		{name: "a string for a number", json: `{"i":"1"}`},
		{name: "bools", json: `{"b":true}`},
		{name: "a bool that is not one", json: `{"b":tru}`},
		{name: "nulls everywhere", json: `{"kind":null,"i":null,"u":null,"f":null,"b":null,"p":null,"ps":null,"l":null,"bytes":null,"ms":null}`},
		{name: "nested", json: `{"kind":"K","ps":{"kind":"inner","l":[1,2,3],"ps":{"i":1}},"ls":[{"kind":"a"},{}]}`},
		{name: "empty slices", json: `{"l":[],"ls":[],"ms":{}}`},
		{name: "a map of slices", json: `{"ms":{"a":["x","y"],"b":[],"c":null}}`},
		{name: "bytes", json: `{"bytes":"aGVsbG8="}`},
		{name: "bytes that are not base64", json: `{"bytes":"!!"}`},
		{name: "a named string and an untagged field", json: `{"named":"u-1","Untagged":"x"}`},
		{name: "keys out of the fields' order", json: `{"u":1,"i":2,"kind":"K"}`},
		{name: "a key twice", json: `{"i":1,"u":2,"i":3}`},
		{name: "an unknown key", json: `{"i":1,"other":2}`, fallback: true},
		{name: "a key of another case", json: `{"I":1}`, fallback: true},
		{name: "an array cut short", json: `{"l":[1,2`},
		{name: "an object cut short", json: `{"ps":{"i":1`},
		{name: "data after", json: `{"i":1}x`},
		{name: "a final newline", json: "{\"i\":1}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { decodesAsSerializer[exactKinds](t, tt.json, tt.fallback) })
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
