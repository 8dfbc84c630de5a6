package object

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// decodeExact decodes data, the compact JSON the storage's encoder
// (encoding/json) writes, into v, a pointer to a struct, as encoding/json
// decodes it, or fails: on anything the encoder does not write (whitespace
// but at the end, an unknown or a differently cased key) and on any type it
// does not decode itself (exactTypes). The caller then decodes with the
// serializer, which accepts all JSON.
//
// It reads the storage's own output only, so it can be small and fast: a
// string's end is found with bytes.IndexByte, a struct's keys are met in
// the order of its fields, and nothing is checked twice.
//
// With share, for the cache's own bytes, a string without an escape is not
// copied: it is the bytes it lies in, which never change once the cache
// built them and are never reused while a string points into them (the
// collector keeps them), so that a decoded object holds the bytes while it
// lives. Nor are such strings checked for what the encoder never writes,
// raw control characters and invalid UTF-8. At 10 KiB, the copy of an
// annotation was most of a decode's time (BenchmarkDecode, exact-shared).
func decodeExact(data []byte, v any, share bool) (err error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errUnsupported
	}
	fn, err := exactTypes.of(rv.Type().Elem())
	if err != nil {
		return err
	}
	defer func() {
		// A bug here must cost a decode by the serializer, not the server.
		if r := recover(); r != nil {
			err = fmt.Errorf("the exact decoder failed on %s: %v", rv.Type(), r)
		}
	}()
	s := &scan{b: data, share: share}
	if err := (*fn)(s, rv.Elem()); err != nil {
		return err
	}
	if len(bytes.TrimRight(s.b[s.i:], " \t\r\n")) > 0 {
		return s.fail("data after the object")
	}
	return nil
}

// errUnsupported is a type decodeExact leaves to the serializer: an
// interface (encoding/json fills it with maps and float64s), an array, a
// map whose keys are not strings, a field whose name another field has, a
// ",string" option, an embedded pointer, a type that decodes itself from
// text only, json.Number.
var errUnsupported = errors.New("a type the exact decoder leaves to the serializer")

// decodeFn decodes the value s is at into v.
type decodeFn func(s *scan, v reflect.Value) error

// typeCache holds each type's decodeFn, or why it has none.
type typeCache struct {
	done sync.Map // reflect.Type → compiled
	// mu serializes compiling.
	mu sync.Mutex
}

type compiled struct {
	fn  *decodeFn
	err error
}

var exactTypes = &typeCache{}

// of returns t's decodeFn.
func (c *typeCache) of(t reflect.Type) (*decodeFn, error) {
	if v, ok := c.done.Load(t); ok {
		return v.(compiled).fn, v.(compiled).err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.done.Load(t); ok {
		return v.(compiled).fn, v.(compiled).err
	}
	cc := compiler{cache: c, fns: map[reflect.Type]*decodeFn{}}
	fn, err := cc.compile(t)
	if err != nil {
		// What compiled beside t may point to t's decodeFn: none is kept.
		c.done.Store(t, compiled{err: err})
		return nil, err
	}
	for t, fn := range cc.fns {
		c.done.Store(t, compiled{fn: fn})
	}
	return fn, nil
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[interface{ UnmarshalText([]byte) error }]()
	timeType        = reflect.TypeFor[metav1.Time]()
)

// compiler compiles a type and the types in it. A recursive type's inner
// uses find the decodeFn its outer use fills in.
type compiler struct {
	cache *typeCache
	fns   map[reflect.Type]*decodeFn
}

func (c *compiler) compile(t reflect.Type) (*decodeFn, error) {
	if v, ok := c.cache.done.Load(t); ok {
		return v.(compiled).fn, v.(compiled).err
	}
	if fn := c.fns[t]; fn != nil {
		return fn, nil
	}
	fn := new(decodeFn)
	c.fns[t] = fn
	var err error
	*fn, err = c.build(t)
	return fn, err
}

func (c *compiler) build(t reflect.Type) (decodeFn, error) {
	switch {
	case t == timeType:
		return decodeTime, nil
	case reflect.PointerTo(t).Implements(jsonUnmarshaler):
		return decodeUnmarshaler, nil
	case reflect.PointerTo(t).Implements(textUnmarshaler), t == reflect.TypeFor[json.Number]():
		return nil, errUnsupported
	}
	switch t.Kind() {
	case reflect.String:
		return decodeString, nil
	case reflect.Bool:
		return decodeBool, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return decodeInt, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return decodeUint, nil
	case reflect.Float32, reflect.Float64:
		return decodeFloat, nil
	case reflect.Pointer:
		elem, err := c.compile(t.Elem())
		return func(s *scan, v reflect.Value) error { return decodePointer(s, v, elem) }, err
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return decodeBytes, nil
		}
		elem, err := c.compile(t.Elem())
		return func(s *scan, v reflect.Value) error { return decodeSlice(s, v, elem) }, err
	case reflect.Map:
		if t.Key().Kind() != reflect.String || reflect.PointerTo(t.Key()).Implements(textUnmarshaler) {
			return nil, errUnsupported
		}
		if t == reflect.TypeFor[map[string]string]() {
			return decodeStringMap, nil
		}
		elem, err := c.compile(t.Elem())
		return func(s *scan, v reflect.Value) error { return decodeMap(s, v, elem) }, err
	case reflect.Struct:
		fields, err := c.fields(t, nil, map[string]bool{})
		return func(s *scan, v reflect.Value) error { return decodeStruct(s, v, fields) }, err
	}
	return nil, errUnsupported
}

// field is a struct's field as JSON names it, by its index path through
// embedded structs.
type field struct {
	name  string
	index []int
	fn    *decodeFn
}

// fields lists t's fields as encoding/json reads them, those of embedded
// structs without a name in their place. Two with one name are left to the
// serializer, which has rules for them.
func (c *compiler) fields(t reflect.Type, at []int, seen map[string]bool) ([]field, error) {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" && opts == "" || !f.IsExported() && !f.Anonymous {
			continue
		}
		if strings.Contains(","+opts+",", ",string,") {
			return nil, errUnsupported
		}
		index := append(append([]int(nil), at...), i)
		if f.Anonymous && tag == "" {
			if f.Type.Kind() == reflect.Pointer {
				return nil, errUnsupported
			}
			if f.Type.Kind() == reflect.Struct {
				inner, err := c.fields(f.Type, index, seen)
				if err != nil {
					return nil, err
				}
				out = append(out, inner...)
				continue
			}
			if !f.IsExported() {
				continue
			}
		}
		name := tag
		if name == "" {
			name = f.Name
		}
		if seen[name] {
			return nil, errUnsupported
		}
		seen[name] = true
		fn, err := c.compile(f.Type)
		if err != nil {
			return nil, err
		}
		out = append(out, field{name: name, index: index, fn: fn})
	}
	return out, nil
}
