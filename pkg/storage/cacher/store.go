package cacher

import (
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/third_party/forked/golang/btree"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// btreeDegree is the fan-out of the object trees. 32 is what upstream's
// watch cache store uses; it keeps copy-on-write after a snapshot at a few
// node copies per write.
const btreeDegree = 32

func newTree() *btree.BTree[*object.Object] {
	return btree.New(btreeDegree, func(a, b *object.Object) bool { return a.Key < b.Key })
}

// snapshot is an immutable view of every object at resourceVersion rv.
type snapshot struct {
	rv   uint64
	tree *btree.BTree[*object.Object]
}

// store holds the current objects ordered by key, live indexes over them,
// and point-in-time snapshots: copy-on-write clones of the tree, O(1) to
// take, after which a write copies only the nodes on its path.
//
// Snapshots are taken when a reader asks for the current state, not at
// every event: a clone per event made every write copy its path, about
// 2 KiB an event kept for the whole history. A state between snapshots is
// rebuilt by undoing the events after it (at).
type store struct {
	indexers map[string]func(*object.Object) []string

	// mu guards everything below.
	mu   sync.RWMutex
	tree *btree.BTree[*object.Object]
	// rv is the resourceVersion of the current state.
	rv uint64
	// indexes map index name → value → key → object, for the current state.
	indexes map[string]map[string]map[string]*object.Object
	// snapshots are ordered by rv, each the state after every event up to
	// its rv; changed is whether the tree changed since the last one.
	snapshots []snapshot
	changed   bool
}

func newStore(indexers map[string]func(*object.Object) []string) *store {
	s := &store{indexers: indexers}
	s.replace(nil, 0)
	return s
}

// replace installs a full list at rv, as after a (re)list.
func (s *store) replace(objs []*object.Object, rv uint64) {
	tree := newTree()
	indexes := map[string]map[string]map[string]*object.Object{}
	for name := range s.indexers {
		indexes[name] = map[string]map[string]*object.Object{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tree, s.indexes, s.rv = tree, indexes, rv
	for _, o := range objs {
		s.tree.ReplaceOrInsert(o)
		s.indexLocked(o, true)
	}
	s.snapshots = []snapshot{{rv: rv, tree: s.tree.Clone()}}
	s.changed = false
}

// apply records an event's effect.
func (s *store) apply(e *event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.prev != nil {
		s.indexLocked(e.prev, false)
	}
	if e.typ == watch.Deleted {
		s.tree.Delete(e.prev)
	} else {
		s.tree.ReplaceOrInsert(e.cur)
		s.indexLocked(e.cur, true)
	}
	s.rv = e.rv
	s.changed = true
}

// advance moves the state's resourceVersion forward with no change, on a
// progress notification.
func (s *store) advance(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv > s.rv {
		s.rv = rv
	}
}

func (s *store) indexLocked(o *object.Object, add bool) {
	for name, fn := range s.indexers {
		for _, v := range fn(o) {
			byValue := s.indexes[name]
			if add {
				if byValue[v] == nil {
					byValue[v] = map[string]*object.Object{}
				}
				byValue[v][o.Key] = o
			} else if byValue[v] != nil {
				delete(byValue[v], o.Key)
				if len(byValue[v]) == 0 {
					delete(byValue, v)
				}
			}
		}
	}
}

// get returns the current object at key.
func (s *store) get(key string) (*object.Object, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tree.Get(&object.Object{Key: key})
}

// latest returns the current state as an immutable snapshot, stamped with
// the newest resourceVersion the store knows, which may be past the last
// event after a progress notification.
func (s *store) latest() snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latestLocked()
}

func (s *store) latestLocked() snapshot {
	if s.changed || len(s.snapshots) == 0 {
		s.snapshots = append(s.snapshots, snapshot{rv: s.rv, tree: s.tree.Clone()})
		s.changed = false
	}
	return snapshot{rv: s.rv, tree: s.snapshots[len(s.snapshots)-1].tree}
}

// at returns the state at exactly rv, if the store can tell it: the
// nearest snapshot at or after rv with the events after rv undone, newest
// first. eventsBetween returns the events in (rv, upTo], and false when
// the history no longer holds them all.
func (s *store) at(rv uint64, eventsBetween func(rv, upTo uint64) ([]*event, bool)) (snapshot, bool) {
	s.mu.Lock()
	if rv > s.rv {
		s.mu.Unlock()
		return snapshot{}, false
	}
	i := sort.Search(len(s.snapshots), func(i int) bool { return s.snapshots[i].rv >= rv })
	var base snapshot
	if i < len(s.snapshots) {
		base = s.snapshots[i]
	} else {
		base = s.latestLocked()
	}
	// Clone writes to the tree it clones (its copy-on-write marker), so
	// two readers must not clone one snapshot at once.
	tree := base.tree.Clone()
	s.mu.Unlock()
	// Logged events are immutable, and the clone is this reader's own.
	events, ok := eventsBetween(rv, base.rv)
	if !ok {
		return snapshot{}, false
	}
	if len(events) == 0 {
		return snapshot{rv: rv, tree: base.tree}, true
	}
	for i := len(events) - 1; i >= 0; i-- {
		switch e := events[i]; e.typ {
		case watch.Added:
			tree.Delete(e.cur)
		default:
			tree.ReplaceOrInsert(e.prev)
		}
	}
	return snapshot{rv: rv, tree: tree}, true
}

// byIndex returns the current objects whose index name has value, ordered
// by key, and the state's resourceVersion. ok is false without such an index.
func (s *store) byIndex(name, value string) (objs []*object.Object, rv uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	byValue, ok := s.indexes[name]
	if !ok {
		return nil, 0, false
	}
	for _, o := range byValue[value] {
		objs = append(objs, o)
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].Key < objs[j].Key })
	return objs, s.rv, true
}

// prune drops snapshots older than rv: the events after them have left
// the history, and a state from rv on is rebuilt from a newer snapshot.
func (s *store) prune(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.snapshots), func(i int) bool { return s.snapshots[i].rv >= rv })
	if i > 0 {
		// Clearing lets the dropped trees be collected; append reallocates
		// the shrinking slice in time, so this stays amortized O(1).
		clear(s.snapshots[:i])
		s.snapshots = s.snapshots[i:]
	}
}

// stats returns the number of objects and of snapshots held.
func (s *store) stats() (objects, snapshots int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tree.Len(), len(s.snapshots)
}

// keys returns every current key, for etcd3's size estimation.
func (s *store) keys() []string {
	snap := s.latest()
	keys := make([]string, 0, snap.tree.Len())
	snap.tree.Ascend(func(o *object.Object) bool {
		keys = append(keys, o.Key)
		return true
	})
	return keys
}

// scan calls fn for each object whose key has prefix (or equals it when not
// recursive), starting at from, in key order, until fn returns false.
func (sn snapshot) scan(prefix string, recursive bool, from string, fn func(*object.Object) bool) {
	if !recursive {
		if o, ok := sn.tree.Get(&object.Object{Key: prefix}); ok && from <= prefix {
			fn(o)
		}
		return
	}
	start := max(from, prefix)
	sn.tree.AscendGreaterOrEqual(&object.Object{Key: start}, func(o *object.Object) bool {
		if !strings.HasPrefix(o.Key, prefix) {
			return false
		}
		return fn(o)
	})
}
