package cacher

import (
	"reflect"

	"k8s.io/apimachinery/pkg/runtime"
)

// approximateSize estimates the bytes a decoded object holds: its structs,
// strings, slices and maps, following pointers. Shared pieces are counted
// each time they are reached, and map overhead is a guess; the estimate is
// for budgets, within tens of percent, not for accounting. It costs one walk
// of the object, a few microseconds for a typical object, once at ingest.
func approximateSize(obj runtime.Object) int64 {
	v := reflect.ValueOf(obj)
	return int64(v.Type().Size()) + sizeOf(v)
}

// mapEntryOverhead is a map entry's share of buckets and hashes, beyond its
// key and value.
const mapEntryOverhead = 16

// sizeOf returns what v references beyond its own inline size.
func sizeOf(v reflect.Value) int64 {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 0
		}
		e := v.Elem()
		if v.Kind() == reflect.Interface {
			// An interface's dynamic value is boxed unless it is a pointer.
			if e.Kind() == reflect.Pointer {
				return sizeOf(e)
			}
			return int64(e.Type().Size()) + sizeOf(e)
		}
		return int64(e.Type().Size()) + sizeOf(e)
	case reflect.String:
		return int64(v.Len())
	case reflect.Struct:
		var n int64
		for i := 0; i < v.NumField(); i++ {
			n += sizeOf(v.Field(i))
		}
		return n
	case reflect.Slice:
		if v.IsNil() {
			return 0
		}
		n := int64(v.Cap()) * int64(v.Type().Elem().Size())
		if hasReferences(v.Type().Elem()) {
			for i := 0; i < v.Len(); i++ {
				n += sizeOf(v.Index(i))
			}
		}
		return n
	case reflect.Array:
		var n int64
		if hasReferences(v.Type().Elem()) {
			for i := 0; i < v.Len(); i++ {
				n += sizeOf(v.Index(i))
			}
		}
		return n
	case reflect.Map:
		if v.IsNil() {
			return 0
		}
		t := v.Type()
		n := int64(v.Len()) * (int64(t.Key().Size()+t.Elem().Size()) + mapEntryOverhead)
		if hasReferences(t.Key()) || hasReferences(t.Elem()) {
			it := v.MapRange()
			for it.Next() {
				n += sizeOf(it.Key()) + sizeOf(it.Value())
			}
		}
		return n
	}
	return 0
}

// hasReferences reports whether values of t may reference memory beyond
// their inline size.
func hasReferences(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.String, reflect.Slice, reflect.Map:
		return true
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			if hasReferences(t.Field(i).Type) {
				return true
			}
		}
		return false
	case reflect.Array:
		return hasReferences(t.Elem())
	}
	return false
}
