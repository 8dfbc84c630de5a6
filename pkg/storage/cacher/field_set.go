package cacher

import (
	"sort"

	"k8s.io/apimachinery/pkg/fields"
)

// fieldSet is an object's selectable fields, sorted by name. GetAttrsFunc
// returns them as a fields.Set, a Go map: for the four or five fields a
// type selects on, that is about 300 bytes an object (buckets for eight),
// where the slice is 32 bytes a field. Field selectors match it through
// fields.Fields. The strings are the map's, shared with the object.
type fieldSet []fieldPair

type fieldPair struct{ name, value string }

var _ fields.Fields = fieldSet(nil)

func newFieldSet(s fields.Set) fieldSet {
	if len(s) == 0 {
		return nil
	}
	f := make(fieldSet, 0, len(s))
	for name, value := range s {
		f = append(f, fieldPair{name: name, value: value})
	}
	sort.Slice(f, func(i, j int) bool { return f[i].name < f[j].name })
	return f
}

// Has reports whether the object has the field.
func (f fieldSet) Has(name string) bool {
	_, ok := f.lookup(name)
	return ok
}

// Get returns the field's value, or "" if the object has no such field.
func (f fieldSet) Get(name string) string {
	v, _ := f.lookup(name)
	return v
}

func (f fieldSet) lookup(name string) (string, bool) {
	i := sort.Search(len(f), func(i int) bool { return f[i].name >= name })
	if i < len(f) && f[i].name == name {
		return f[i].value, true
	}
	return "", false
}
