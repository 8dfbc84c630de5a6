package object

import (
	"encoding/binary"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

// defaultInternBudget bounds what an interner's tables hold, per cache.
const defaultInternBudget = 8 << 20

// interner makes the objects a cache holds share equal label sets and
// selectable field values instead of each keeping its own: the objects of
// one owner carry the same labels, and the fields (namespace, phase) take
// few values. When label sets were maps, a map of one entry alone took
// about 300 bytes, and at 100,000 objects with 10 label sets the interner
// saved 700 bytes an object, 28% of the heap (docs/benchmarks.md, "What
// each mechanism buys"); a set is now sorted pairs (Labels), whose strings
// it still shares when the set is an object's own.
// Objects in the cache are read-only, so sharing between them is safe.
//
// The tables only grow, up to a byte budget; past it new values are no
// longer added, and what is in the tables is still shared.
type interner struct {
	// mu guards everything below.
	mu      sync.Mutex
	strings map[string]string
	// labelSets and fieldSets are whole label sets and field lists, by a
	// key spelling out their contents (see keyString).
	labelSets map[string]*Labels
	fieldSets map[string]*attrs
	// key is scratch space for the keys of the sets.
	key []byte
	// bytes estimates what the tables hold; budget bounds it.
	bytes, budget int64
}

func newInterner(budget int64) *interner {
	return &interner{strings: map[string]string{}, labelSets: map[string]*Labels{}, fieldSets: map[string]*attrs{}, budget: budget}
}

// labels returns the shared label set equal to l, as sorted pairs: a new
// one, with its keys and values shared, if there is none yet.
func (in *interner) labels(l labels.Set) *Labels {
	keys := sortedKeys(l)
	in.mu.Lock()
	defer in.mu.Unlock()
	in.setKey(keys, l)
	if shared, ok := in.labelSets[string(in.key)]; ok {
		return shared
	}
	shared := labelPairs(keys, l, in.str)
	if in.add(int64(len(in.key)) + 64 + 32*int64(len(keys))) {
		in.labelSets[string(in.key)] = shared
	}
	return shared
}

// Fields returns the attrs that hold f but the name and the trigger field,
// which the object keeps apart, as sorted name and value pairs, shared with
// every object that has the same; nil if there are none.
func (in *interner) fields(f fields.Set, trigger string) *attrs {
	names := make([]string, 0, len(f))
	for name := range f {
		if name != NameField && name != trigger {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	in.mu.Lock()
	defer in.mu.Unlock()
	in.setKey(names, f)
	if shared, ok := in.fieldSets[string(in.key)]; ok {
		return shared
	}
	pairs := make([]string, 0, 2*len(names))
	for _, name := range names {
		pairs = append(pairs, in.str(name), in.str(f[name]))
	}
	shared := &attrs{fields: pairs}
	if in.add(int64(len(in.key)) + 112 + 32*int64(len(names))) {
		in.fieldSets[string(in.key)] = shared
	}
	return shared
}

// setKey makes the key spell out the names, in their order, and their
// values in m.
func (in *interner) setKey(names []string, m map[string]string) {
	in.key = in.key[:0]
	for _, name := range names {
		in.keyString(name)
		in.keyString(m[name])
	}
}

// keyString appends s to the key, after its length, so that no two
// sequences of strings spell the same key.
func (in *interner) keyString(s string) {
	in.key = append(binary.AppendUvarint(in.key, uint64(len(s))), s...)
}

func (in *interner) str(s string) string {
	if s == "" {
		return s
	}
	if shared, ok := in.strings[s]; ok {
		return shared
	}
	if in.add(int64(len(s)) + 32) {
		in.strings[s] = s
	}
	return s
}

// add reports whether n more bytes fit the budget, and counts them if so.
func (in *interner) add(n int64) bool {
	if in.bytes+n > in.budget {
		return false
	}
	in.bytes += n
	return true
}
