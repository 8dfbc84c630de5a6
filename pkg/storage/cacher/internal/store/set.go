package store

import (
	"iter"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// set is the current objects with one value of an index. Most values of
// an index over objects like a real cluster's (a node's name, an owner's)
// have one object, which the set holds without a map: a map of one entry
// cost about 175 B more an object than this set (store-B 270 against 94,
// BenchmarkVersionCost/unique, docs/architecture.md). A value's second
// object makes the map, which then stays until the value has none.
//
// The index holds a pointer to it, changed in place: storing a changed set
// back under an equal value would store that value's string too, which
// may lie in an object's key (Store.indexLocked).
type set struct {
	one  *object.Object
	many map[*object.Object]struct{}
}

// add adds o.
func (s *set) add(o *object.Object) {
	switch {
	case s.many != nil:
		s.many[o] = struct{}{}
	case s.one == nil || s.one == o:
		s.one = o
	default:
		s.many = map[*object.Object]struct{}{s.one: {}, o: {}}
		s.one = nil
	}
}

// remove removes o.
func (s *set) remove(o *object.Object) {
	if s.many != nil {
		delete(s.many, o)
	} else if s.one == o {
		s.one = nil
	}
}

// empty reports whether s holds no object.
func (s *set) empty() bool { return s.one == nil && len(s.many) == 0 }

// all yields s's objects, in no order.
func (s *set) all() iter.Seq[*object.Object] {
	return func(yield func(*object.Object) bool) {
		if s.one != nil {
			yield(s.one)
			return
		}
		for o := range s.many {
			if !yield(o) {
				return
			}
		}
	}
}
