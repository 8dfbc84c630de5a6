package fanout

import (
	"math"
	"slices"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

// shardIndex finds the sharded watchers whose ranges hold a hash. Watchers
// with the same selector share a group; a segment tree over the groups'
// ranges answers a hash with the groups that hold it, in O(log ranges)
// plus the groups found, each at most once. Upstream offers every event
// to every sharded watcher, which hashes the object itself.
//
// The tree is rebuilt, on the next lookup, when a group comes or goes;
// watchers joining or leaving an existing group change nothing but the
// group. Ranges that overlap cost nothing extra: a range sits in at most
// two tree nodes a level.
type shardIndex struct {
	groups map[string]*shardGroup
	// tree is nil when groups changed since it was built.
	tree *segmentTree
}

// shardGroup is the synced watchers with one selector.
type shardGroup struct {
	ranges []shard.Range
	set    watcherSet
}

func newShardIndex() *shardIndex { return &shardIndex{groups: map[string]*shardGroup{}} }

// set returns the watcher set of r's selector, making its group if needed.
func (x *shardIndex) set(r *shard.Selector) *watcherSet {
	g, ok := x.groups[r.Text]
	if !ok {
		g = &shardGroup{ranges: r.Ranges}
		x.groups[r.Text] = g
		x.tree = nil
	}
	return &g.set
}

// remove forgets the group of a selector, once its set is empty.
func (x *shardIndex) remove(selector string) {
	delete(x.groups, selector)
	x.tree = nil
}

// appendSets appends the sets of the groups whose ranges hold h.
func (x *shardIndex) appendSets(sets []*watcherSet, h uint64) []*watcherSet {
	if len(x.groups) == 0 {
		return sets
	}
	if x.tree == nil {
		x.tree = newSegmentTree(x.groups)
	}
	return x.tree.appendSets(sets, h)
}

// segmentTree is a segment tree over the elementary intervals that the
// groups' range bounds cut the hash space into. Each node holds the
// groups whose ranges cover its whole interval and not its parent's.
type segmentTree struct {
	// starts are the elementary intervals' first hashes, ascending; the
	// first is 0 and each runs to the next's start.
	starts []uint64
	// nodes is the tree in an array: node i's children are 2i+1 and 2i+2.
	nodes [][]*shardGroup
}

func newSegmentTree(groups map[string]*shardGroup) *segmentTree {
	starts := []uint64{0}
	for _, g := range groups {
		for _, r := range g.ranges {
			starts = append(starts, r.Lo)
			if r.Hi < math.MaxUint64 {
				starts = append(starts, r.Hi+1)
			}
		}
	}
	slices.Sort(starts)
	t := &segmentTree{starts: slices.Compact(starts)}
	t.nodes = make([][]*shardGroup, 4*len(t.starts))
	for _, g := range groups {
		for _, r := range g.ranges {
			first := t.interval(r.Lo)
			last := t.interval(r.Hi)
			t.insert(0, 0, len(t.starts)-1, first, last, g)
		}
	}
	return t
}

// interval returns the elementary interval holding h.
func (t *segmentTree) interval(h uint64) int {
	i, found := slices.BinarySearch(t.starts, h)
	if !found {
		i--
	}
	return i
}

// insert puts g on the nodes that together cover intervals first to last,
// below node, which covers intervals lo to hi.
func (t *segmentTree) insert(node, lo, hi, first, last int, g *shardGroup) {
	if first <= lo && hi <= last {
		t.nodes[node] = append(t.nodes[node], g)
		return
	}
	mid := (lo + hi) / 2
	if first <= mid {
		t.insert(2*node+1, lo, mid, first, last, g)
	}
	if last > mid {
		t.insert(2*node+2, mid+1, hi, first, last, g)
	}
}

// appendSets appends the sets of the groups on the path to h's interval.
// A group's ranges are disjoint, so one of them at most covers h, and it
// sits on one node of the path at most.
func (t *segmentTree) appendSets(sets []*watcherSet, h uint64) []*watcherSet {
	i := t.interval(h)
	node, lo, hi := 0, 0, len(t.starts)-1
	for {
		for _, g := range t.nodes[node] {
			sets = append(sets, &g.set)
		}
		if lo == hi {
			return sets
		}
		mid := (lo + hi) / 2
		if i <= mid {
			node, hi = 2*node+1, mid
		} else {
			node, lo = 2*node+2, mid+1
		}
	}
}
