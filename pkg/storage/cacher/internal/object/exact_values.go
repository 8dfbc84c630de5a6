package object

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func decodeString(s *scan, v reflect.Value) error {
	if s.null() {
		return nil
	}
	str, err := s.str()
	v.SetString(str)
	return err
}

func decodeBool(s *scan, v reflect.Value) error {
	switch lit := string(s.literal()); lit {
	case "true", "false":
		v.SetBool(lit == "true")
	case "null":
	default:
		return s.fail("want a bool")
	}
	return nil
}

func decodeInt(s *scan, v reflect.Value) error {
	lit := s.literal()
	if string(lit) == "null" {
		return nil
	}
	neg := len(lit) > 0 && lit[0] == '-'
	n, ok := digits(bytes.TrimPrefix(lit, []byte("-")))
	if !ok || n > 1<<63 || !neg && n == 1<<63 {
		return s.fail("want an integer")
	}
	i := int64(n)
	if neg {
		i = -i
	}
	if v.OverflowInt(i) {
		return s.fail("an integer too large")
	}
	v.SetInt(i)
	return nil
}

func decodeUint(s *scan, v reflect.Value) error {
	lit := s.literal()
	if string(lit) == "null" {
		return nil
	}
	n, ok := digits(lit)
	if !ok || v.OverflowUint(n) {
		return s.fail("want an unsigned integer")
	}
	v.SetUint(n)
	return nil
}

// digits parses b as encoding/json writes an unsigned integer.
func digits(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 1 && b[0] == '0' {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' || n > (1<<64-1-uint64(c-'0'))/10 {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

func decodeFloat(s *scan, v reflect.Value) error {
	lit := s.literal()
	if string(lit) == "null" {
		return nil
	}
	if len(lit) == 0 || !json.Valid(lit) || !strings.ContainsRune("-0123456789", rune(lit[0])) {
		return s.fail("want a number")
	}
	f, err := strconv.ParseFloat(string(lit), v.Type().Bits())
	if err != nil {
		return s.fail("want a number")
	}
	v.SetFloat(f)
	return nil
}

func decodeBytes(s *scan, v reflect.Value) error {
	if s.null() {
		v.SetZero()
		return nil
	}
	raw, escaped, err := s.rawString()
	if err != nil || escaped {
		return cmpErr(err, s.fail("want base64"))
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(len(raw)))
	n, err := base64.StdEncoding.Decode(b, raw)
	if err != nil {
		return s.fail("want base64")
	}
	v.SetBytes(b[:n])
	return nil
}

// cmpErr is err, or else alt.
func cmpErr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// decodeTime decodes a metav1.Time as its UnmarshalJSON does, without
// copying the string out and decoding it again.
func decodeTime(s *scan, v reflect.Value) error {
	t := v.Addr().Interface().(*metav1.Time)
	if s.null() {
		*t = metav1.Time{}
		return nil
	}
	raw, escaped, err := s.rawString()
	if err != nil || escaped {
		return cmpErr(err, s.fail("an escaped time"))
	}
	// time.Time's UnmarshalText parses RFC 3339 from bytes, as
	// metav1.Time's UnmarshalJSON does from a string.
	if err := t.Time.UnmarshalText(raw); err != nil {
		return err
	}
	t.Time = t.Time.Local()
	return nil
}

// decodeUnmarshaler hands the value to the type's UnmarshalJSON, null
// included, as encoding/json does; it copies what it keeps.
func decodeUnmarshaler(s *scan, v reflect.Value) error {
	raw := s.value()
	if len(raw) == 0 {
		return s.fail("want a value")
	}
	return v.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(raw)
}

func decodePointer(s *scan, v reflect.Value, elem *decodeFn) error {
	if s.null() {
		v.SetZero()
		return nil
	}
	if v.IsNil() {
		v.Set(reflect.New(v.Type().Elem()))
	}
	return (*elem)(s, v.Elem())
}

func decodeSlice(s *scan, v reflect.Value, elem *decodeFn) error {
	if s.null() {
		v.SetZero()
		return nil
	}
	if err := s.eat('['); err != nil {
		return err
	}
	if v.IsNil() {
		v.Set(reflect.MakeSlice(v.Type(), 0, 0)) // [] is an empty slice, not nil
	}
	v.SetLen(0)
	for n := 0; s.next() != ']'; n++ {
		if n > 0 {
			if err := s.eat(','); err != nil {
				return err
			}
		}
		v.Grow(1)
		v.SetLen(n + 1)
		e := v.Index(n)
		e.SetZero()
		if err := (*elem)(s, e); err != nil {
			return err
		}
	}
	return s.eat(']')
}

// decodeStringMap decodes the two maps every object holds, labels and
// annotations, with no reflection per entry.
func decodeStringMap(s *scan, v reflect.Value) error {
	m := v.Addr().Interface().(*map[string]string)
	if s.null() {
		*m = nil
		return nil
	}
	if *m == nil {
		*m = map[string]string{}
	}
	return s.entries(func(key []byte) error {
		val := ""
		if !s.null() {
			var err error
			if val, err = s.str(); err != nil {
				return err
			}
		}
		(*m)[s.keyString(key)] = val
		return nil
	})
}

func decodeMap(s *scan, v reflect.Value, elem *decodeFn) error {
	if s.null() {
		v.SetZero()
		return nil
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	return s.entries(func(key []byte) error {
		e := reflect.New(v.Type().Elem()).Elem()
		if err := (*elem)(s, e); err != nil {
			return err
		}
		v.SetMapIndex(reflect.ValueOf(s.keyString(key)).Convert(v.Type().Key()), e)
		return nil
	})
}

// decodeStruct decodes an object into v's fields, expecting its keys in
// the fields' order, as the encoder writes them; a key no field has fails.
func decodeStruct(s *scan, v reflect.Value, fields []field) error {
	if s.null() {
		return nil
	}
	next := 0
	return s.entries(func(key []byte) error {
		i := next
		for i < len(fields) && fields[i].name != string(key) {
			i++
		}
		if i == len(fields) {
			for i = 0; i < next && fields[i].name != string(key); i++ {
			}
			if i == next {
				return s.fail("an unknown key " + strconv.Quote(string(key)))
			}
		}
		next = i + 1
		return (*fields[i].fn)(s, v.FieldByIndex(fields[i].index))
	})
}
