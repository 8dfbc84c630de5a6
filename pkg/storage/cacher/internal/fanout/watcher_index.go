package fanout

import (
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

// placeKind is which part of the watcher index holds a watcher.
type placeKind uint8

const (
	// byPrefix holds recursive watchers with nothing narrower, by their key
	// prefix: the resource's, which is the broadcast set, or a namespace's.
	byPrefix placeKind = iota
	// byKey holds watchers of one key: the generic registry's watch with a
	// metadata.name field selector in a namespace, or of a cluster-scoped object.
	byKey
	// byTrigger holds watchers whose field selector pins Config.TriggerField.
	byTrigger
	// byName holds watchers whose field selector pins metadata.name across
	// namespaces.
	byName
	// byLabel holds watchers whose label selector pins a label to one
	// value, by "key=value": neither holds "=".
	byLabel
	// byShard holds sharded watchers, by their shard selector.
	byShard
)

// place is where a watcher sits in the index: the most selective part
// that can hold it, in the order of placeKind, narrowest first.
type place struct {
	kind placeKind
	// value is the key, prefix, trigger value or name.
	value string
	// shard is the selector of a byShard watcher.
	shard *shard.Selector
}

// placeFor picks the place of a watcher of key (a prefix if recursive)
// with filter f; trigger is Config.TriggerField.
func placeFor(key string, recursive bool, f *Filter, trigger string) place {
	if !recursive {
		return place{kind: byKey, value: key}
	}
	if v, ok := f.requiresExactMatch(trigger); ok {
		return place{kind: byTrigger, value: v}
	}
	if v, ok := f.requiresExactMatch(object.NameField); ok {
		return place{kind: byName, value: v}
	}
	if kv, ok := f.pinnedLabel(); ok {
		return place{kind: byLabel, value: kv}
	}
	if f != nil && f.shard != nil {
		return place{kind: byShard, shard: f.shard}
	}
	return place{kind: byPrefix, value: key}
}

// watcherSet is the synced watchers of one place. Each watcher knows its
// position, so that leaving is O(1).
type watcherSet struct {
	ws []*Watcher
	// place is the set's own, for forgetting it once it is empty.
	place place
	// mark is the last lookup that returned the set, so that a lookup
	// returns it once.
	mark uint64
}

// watcherIndex files the synced watchers by what narrows them, so that an
// event is offered only to the watchers that may match it: those of its
// key, of the key's prefixes, of its objects' trigger values, names and
// labels, and of the shard ranges that hold its objects' hashes. The cost of an
// event grows with those watchers, not with every watcher. Every watcher
// sits in one set; each still checks its whole filter, since the index
// narrows by one part of it.
//
// It is not safe for concurrent use: the dispatcher guards it with its mu.
type watcherIndex struct {
	// sets hold byPrefix, byKey, byTrigger, byName and byLabel watchers
	// by value.
	sets [byShard]map[string]*watcherSet
	// shards hold byShard watchers, by the field their selector hashes.
	shards [shard.Fields]*shardIndex
	// n counts the watchers in the index.
	n int
	// mark numbers lookups; found is the last one's result.
	mark  uint64
	found []*watcherSet
	// scratch holds one shard lookup's sets, label one label's key.
	scratch []*watcherSet
	label   []byte
}

func newWatcherIndex() *watcherIndex {
	x := &watcherIndex{}
	for i := range x.sets {
		x.sets[i] = map[string]*watcherSet{}
	}
	for i := range x.shards {
		x.shards[i] = newShardIndex()
	}
	return x
}

// add files w at w.place.
func (x *watcherIndex) add(w *Watcher) {
	var s *watcherSet
	if p := w.place; p.kind == byShard {
		s = x.shards[p.shard.Field].set(p.shard)
		s.place = p
	} else if s = x.sets[p.kind][p.value]; s == nil {
		s = &watcherSet{place: p}
		x.sets[p.kind][p.value] = s
	}
	w.set, w.index = s, len(s.ws)
	s.ws = append(s.ws, w)
	x.n++
}

// remove takes w out of its set, and forgets the set if it is empty.
func (x *watcherIndex) remove(w *Watcher) {
	s := w.set
	last := s.ws[len(s.ws)-1]
	s.ws[w.index] = last
	last.index = w.index
	s.ws[len(s.ws)-1] = nil
	s.ws = s.ws[:len(s.ws)-1]
	w.set = nil
	x.n--
	if len(s.ws) > 0 {
		return
	}
	if p := s.place; p.kind == byShard {
		x.shards[p.shard.Field].remove(p.shard.Text)
	} else {
		delete(x.sets[p.kind], p.value)
	}
}

// lookup returns the sets whose watchers may match e, each once. The
// slice is valid until the next lookup.
func (x *watcherIndex) lookup(e *Event) []*watcherSet {
	x.mark++
	x.found = x.found[:0]
	x.addSet(x.sets[byKey][e.Key])
	if prefixes := x.sets[byPrefix]; len(prefixes) > 0 {
		for i := len(e.Key) - 1; i >= 0; i-- {
			if e.Key[i] == '/' {
				x.addSet(prefixes[e.Key[:i+1]])
			}
		}
	}
	for _, o := range [2]*object.Object{e.Cur, e.Prev} {
		if o == nil {
			continue
		}
		if len(x.sets[byTrigger]) > 0 {
			x.addSet(x.sets[byTrigger][o.Trigger])
		}
		if len(x.sets[byName]) > 0 {
			x.addSet(x.sets[byName][o.Name()])
		}
		if byLabel := x.sets[byLabel]; len(byLabel) > 0 {
			for k, v := range o.Labels().All() {
				x.label = append(append(append(x.label[:0], k...), '='), v...)
				// The conversion in the index expression does not allocate.
				x.addSet(byLabel[string(x.label)])
			}
		}
		for field, shards := range x.shards {
			x.scratch = shards.appendSets(x.scratch[:0], o.Hashes[field])
			for _, s := range x.scratch {
				x.addSet(s)
			}
		}
	}
	return x.found
}

func (x *watcherIndex) addSet(s *watcherSet) {
	if s != nil && s.mark != x.mark {
		s.mark = x.mark
		x.found = append(x.found, s)
	}
}

// each calls fn for every watcher in the index. fn must not change the index.
func (x *watcherIndex) each(fn func(*Watcher)) {
	for _, sets := range x.sets {
		for _, s := range sets {
			for _, w := range s.ws {
				fn(w)
			}
		}
	}
	for _, shards := range x.shards {
		for _, g := range shards.groups {
			for _, w := range g.set.ws {
				fn(w)
			}
		}
	}
}

// len returns how many watchers the index holds.
func (x *watcherIndex) len() int { return x.n }
