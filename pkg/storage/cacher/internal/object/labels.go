package object

import (
	"iter"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// Labels is an object's label set as its keys and values in pairs, sorted
// by key: k0, v0, k1, v1, …. A Go map of a few labels takes about 300
// bytes; the pairs of the same set take 32 bytes a label, and their
// strings are the interner's. At 100,000 objects of the realistic corpus,
// whose 3–6 labels rarely make a set another object has, the maps were
// 295 B an object of the 1,884 the cache held (docs/benchmarks.md,
// "Where the rest goes").
//
// A *Labels is what selectors are given, labels.Labels, without an
// allocation per match: a pointer fits in an interface, a slice does not.
// A nil *Labels is the empty set.
type Labels []string

var _ labels.Labels = (*Labels)(nil)

// linearLabels is the count of labels up to which Lookup compares each
// key in turn: a binary search's branches cost more than they save below it.
const linearLabels = 8

// Lookup returns the value of the label key, and whether the set has it.
func (l *Labels) Lookup(key string) (string, bool) {
	if l == nil {
		return "", false
	}
	pairs := *l
	n := len(pairs) / 2
	if n <= linearLabels {
		for i := 0; i < len(pairs); i += 2 {
			if pairs[i] == key {
				return pairs[i+1], true
			}
		}
		return "", false
	}
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if pairs[2*m] < key {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < n && pairs[2*lo] == key {
		return pairs[2*lo+1], true
	}
	return "", false
}

// Has reports whether the set has the label key.
func (l *Labels) Has(key string) bool {
	_, ok := l.Lookup(key)
	return ok
}

// Get returns the value of the label key, or "".
func (l *Labels) Get(key string) string {
	v, _ := l.Lookup(key)
	return v
}

// Len is the number of labels.
func (l *Labels) Len() int {
	if l == nil {
		return 0
	}
	return len(*l) / 2
}

// All yields each label's key and value, in the order of the keys.
func (l *Labels) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		if l == nil {
			return
		}
		pairs := *l
		for i := 0; i < len(pairs); i += 2 {
			if !yield(pairs[i], pairs[i+1]) {
				return
			}
		}
	}
}

// Set returns the labels as a labels.Set, a map of its own.
func (l *Labels) Set() labels.Set {
	s := make(labels.Set, l.Len())
	for k, v := range l.All() {
		s[k] = v
	}
	return s
}

// NewLabels returns l as sorted pairs, with nothing shared: for objects
// made without a Builder, whose interner shares equal sets. nil for none.
func NewLabels(l labels.Set) *Labels {
	if len(l) == 0 {
		return nil
	}
	return labelPairs(sortedKeys(l), l, func(s string) string { return s })
}

// sortedKeys returns l's keys, sorted.
func sortedKeys(l labels.Set) []string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// labelPairs returns the labels of l that keys name, in their order, each
// key and value as str returns it.
func labelPairs(keys []string, l labels.Set, str func(string) string) *Labels {
	pairs := make(Labels, 0, 2*len(keys))
	for _, k := range keys {
		pairs = append(pairs, str(k), str(l[k]))
	}
	return &pairs
}
