package store

import (
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
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

// Snapshot is an immutable view of every object at resourceVersion RV.
type Snapshot struct {
	RV   uint64
	tree *btree.BTree[*object.Object]
}

// Len is the number of objects in the snapshot.
func (sn Snapshot) Len() int { return sn.tree.Len() }

// Scan calls fn for each object whose key has prefix (or equals it when not
// recursive), starting at from, in key order, until fn returns false. An
// empty prefix, recursive, is every object.
func (sn Snapshot) Scan(prefix string, recursive bool, from string, fn func(*object.Object) bool) {
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

// Count returns how many objects Scan(prefix, true, from, ...) would visit:
// a page's remainingItemCount. It reads the keys only of the objects the
// tree's seeks compare with, where Scan reads every object's key: counting
// the last 50,000 of 100,000 objects of 1 KiB took a tenth of a walk's
// time with the objects laid out at random, and two thirds in key order
// (BenchmarkRemaining). The price is that it counts what lies past the
// prefix's range twice, once in each tail, since stopping at the range's
// end would read every key again.
func (sn Snapshot) Count(prefix, from string) int {
	n := sn.countFrom(max(from, prefix))
	// etcd's range end for the prefix: "\x00" when none exists (an empty
	// prefix, or one of only 0xff bytes); a real end's last byte is above 0.
	if end := clientv3.GetPrefixRangeEnd(prefix); end != "\x00" {
		n -= sn.countFrom(end)
	}
	return n
}

// countFrom returns how many objects' keys are at least key.
func (sn Snapshot) countFrom(key string) int {
	n := 0
	sn.tree.AscendGreaterOrEqual(&object.Object{Key: key}, func(*object.Object) bool {
		n++
		return true
	})
	return n
}
