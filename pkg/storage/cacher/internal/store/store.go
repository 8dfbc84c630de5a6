// Package store is the watch cache's current state: every object ordered
// by key, live indexes over them, and point-in-time snapshots by
// resourceVersion. It knows of an event only its type, its resourceVersion
// and the object versions before and after it.
package store

import (
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/third_party/forked/golang/btree"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// Event is what the store needs of an event.
type Event interface {
	// RV is the event's resourceVersion.
	RV() uint64
	// Change is the event's type, the object after it (for DELETED, the
	// last state at the deletion's resourceVersion) and the object before
	// it (nil for ADDED).
	Change() (typ watch.EventType, cur, prev *object.Object)
}

// Store holds the current objects ordered by key, live indexes over them,
// and point-in-time snapshots: copy-on-write clones of the tree, O(1) to
// take, after which a write copies only the nodes on its path.
//
// Snapshots are taken when a reader asks for the current state, not at
// every event: a clone per event made every write copy its path, about
// 2 KiB an event kept for the whole history. A state between snapshots is
// rebuilt by undoing the events after it (At).
type Store[E Event] struct {
	indexers map[string]func(*object.Object) []string

	// mu guards everything below.
	mu   sync.RWMutex
	tree *btree.BTree[*object.Object]
	// rv is the resourceVersion of the current state.
	rv uint64
	// stored is the sum of the current objects' StoredSize.
	stored int64
	// indexes map index name → value → the current objects with it: a set
	// of pointers, not a map by key, 8-byte slots against 24, 8 B less an
	// object, and no map at all for a value of one object (set).
	indexes map[string]map[string]*set
	// snapshots are ordered by rv, each the state after every event up to
	// its rv; changed is whether the tree changed since the last one.
	snapshots []Snapshot
	changed   bool
}

// New returns an empty store at resourceVersion 0 with the given indexes.
func New[E Event](indexers map[string]func(*object.Object) []string) *Store[E] {
	s := &Store[E]{indexers: indexers}
	s.Replace(nil, 0)
	return s
}

// Replace installs a full list at rv, as after a (re)list.
func (s *Store[E]) Replace(objs []*object.Object, rv uint64) {
	tree := newTree()
	indexes := map[string]map[string]*set{}
	for name := range s.indexers {
		indexes[name] = map[string]*set{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tree, s.indexes, s.rv, s.stored = tree, indexes, rv, 0
	for _, o := range objs {
		s.putLocked(o)
	}
	s.snapshots = []Snapshot{{RV: rv, tree: s.tree.Clone()}}
	s.changed = false
}

// Apply records one revision's events, at once: no reader sees the state
// with part of them.
func (s *Store[E]) Apply(rev ...E) {
	if len(rev) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range rev {
		typ, cur, prev := e.Change()
		if typ != watch.Deleted {
			s.putLocked(cur)
		} else if old, ok := s.tree.Delete(prev); ok {
			s.stored -= old.StoredSize()
			s.indexLocked(old, false)
		}
	}
	s.rv = max(s.rv, rev[len(rev)-1].RV())
	s.changed = true
}

// putLocked puts o in the tree and the indexes, in place of the object at
// its key: the one the tree held, whichever the event said it replaced.
func (s *Store[E]) putLocked(o *object.Object) {
	if old, ok := s.tree.ReplaceOrInsert(o); ok {
		s.stored -= old.StoredSize()
		s.indexLocked(old, false)
	}
	s.stored += o.StoredSize()
	s.indexLocked(o, true)
}

// Advance moves the state's resourceVersion forward with no change, on a
// progress notification.
func (s *Store[E]) Advance(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv > s.rv {
		s.rv = rv
	}
}

func (s *Store[E]) indexLocked(o *object.Object, add bool) {
	for name, fn := range s.indexers {
		for _, v := range fn(o) {
			byValue := s.indexes[name]
			objs := byValue[v]
			switch {
			case add && objs == nil:
				// A copy: v may lie in o's key (Object.Name), which the
				// index would otherwise hold after o has gone.
				objs = &set{}
				byValue[strings.Clone(v)] = objs
				objs.add(o)
			case add:
				objs.add(o)
			case objs != nil:
				if objs.remove(o); objs.empty() {
					delete(byValue, v)
				}
			}
		}
	}
}

// Get returns the current object at key.
func (s *Store[E]) Get(key string) (*object.Object, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tree.Get(&object.Object{Key: key})
}

// Latest returns the current state as an immutable snapshot, stamped with
// the newest resourceVersion the store knows, which may be past the last
// event after a progress notification.
func (s *Store[E]) Latest() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latestLocked()
}

func (s *Store[E]) latestLocked() Snapshot {
	if s.changed || len(s.snapshots) == 0 {
		s.snapshots = append(s.snapshots, Snapshot{RV: s.rv, tree: s.tree.Clone()})
		s.changed = false
	}
	return Snapshot{RV: s.rv, tree: s.snapshots[len(s.snapshots)-1].tree}
}

// At returns the state at exactly rv, if the store can tell it: the
// nearest snapshot at or after rv with the events after rv undone, newest
// first. between returns the events in (rv, upTo], and false when the
// history no longer holds them all. The caller must know that between
// holds every event the store has applied: see Base.
func (s *Store[E]) At(rv uint64, between func(rv, upTo uint64) ([]E, bool)) (Snapshot, bool) {
	b, ok := s.Base(rv)
	if !ok {
		return Snapshot{}, false
	}
	return s.Rebuild(b, between)
}

// Base is what a state at an older resourceVersion is rebuilt from: the
// nearest snapshot at or after it, and the reader's own clone of it.
type Base[E Event] struct {
	rv   uint64
	snap Snapshot
	tree *btree.BTree[*object.Object]
}

// Base returns the base of the state at exactly rv, or false if rv is
// past the state. It is O(1). A reader that rebuilds from it must take it
// where the history holds every event the store has applied (the
// dispatcher's lock): a base taken between the store's apply of a
// revision and the history's append of it holds a revision the history
// cannot undo.
func (s *Store[E]) Base(rv uint64) (Base[E], bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv > s.rv {
		return Base[E]{}, false
	}
	i := sort.Search(len(s.snapshots), func(i int) bool { return s.snapshots[i].RV >= rv })
	var base Snapshot
	if i < len(s.snapshots) {
		base = s.snapshots[i]
	} else {
		base = s.latestLocked()
	}
	// Clone writes to the tree it clones (its copy-on-write marker), so
	// two readers must not clone one snapshot at once.
	return Base[E]{rv: rv, snap: base, tree: base.tree.Clone()}, true
}

// Rebuild returns the state at b's resourceVersion: b's snapshot with the
// events after it undone, newest first, as between returns them.
func (s *Store[E]) Rebuild(b Base[E], between func(rv, upTo uint64) ([]E, bool)) (Snapshot, bool) {
	// Events are immutable, and the clone is this reader's own.
	events, ok := between(b.rv, b.snap.RV)
	if !ok {
		return Snapshot{}, false
	}
	if len(events) == 0 {
		return Snapshot{RV: b.rv, tree: b.snap.tree}, true
	}
	tree := b.tree
	for i := len(events) - 1; i >= 0; i-- {
		switch typ, cur, prev := events[i].Change(); typ {
		case watch.Added:
			tree.Delete(cur)
		default:
			tree.ReplaceOrInsert(prev)
		}
	}
	return Snapshot{RV: b.rv, tree: tree}, true
}

// ByIndex returns the current objects whose index name has value, ordered
// by key, and the state's resourceVersion. ok is false without such an index.
func (s *Store[E]) ByIndex(name, value string) (objs []*object.Object, rv uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	byValue, ok := s.indexes[name]
	if !ok {
		return nil, 0, false
	}
	if set := byValue[value]; set != nil {
		for o := range set.all() {
			objs = append(objs, o)
		}
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].Key < objs[j].Key })
	return objs, s.rv, true
}

// Prune drops snapshots older than rv: the events after them have left
// the history, and a state from rv on is rebuilt from a newer snapshot.
func (s *Store[E]) Prune(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.snapshots), func(i int) bool { return s.snapshots[i].RV >= rv })
	if i > 0 {
		// Clearing lets the dropped trees be collected; append reallocates
		// the shrinking slice in time, so this stays amortized O(1).
		clear(s.snapshots[:i])
		s.snapshots = s.snapshots[i:]
	}
}

// Counts are what the store holds.
type Counts struct {
	// Objects is the number of current objects, and Stored the sum of their
	// StoredSize: what etcd holds for them.
	Objects int
	Stored  int64
	// Snapshots is the number of snapshots held.
	Snapshots int
}

// Counts returns what the store holds.
func (s *Store[E]) Counts() Counts {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Counts{Objects: s.tree.Len(), Stored: s.stored, Snapshots: len(s.snapshots)}
}
