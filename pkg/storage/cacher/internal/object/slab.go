package object

import "unsafe"

// slabSize is the most bytes of objects one slab holds: above Go's 32 KiB
// small-object limit, so that a slab has a span of its own.
const slabSize = 64 << 10

// PackBytes moves the bytes and keys of a listed page's objects into
// slabs, side by side, each object's slice cut to its length. Only a list
// calls it, before anyone else holds the objects.
//
// Go's heap never moves an object, and a span of one size class is free
// only once every slot in it is. Made one by one while a page is read, the
// objects' bytes fall among the page's garbage of the same size classes:
// etcd's values, of almost the same length, and the decoder's buffers.
// Packed, at 100,000 objects of 1 KiB the heap in use after a cold start
// went from 2,717 to 2,490 bytes an object (docs/benchmarks.md, "What each
// mechanism buys"). The key goes beside the bytes, as keyInSlack puts it.
// Each slab is allocated at the length nextSlab picks for it.
//
// A slab is freed when none of its objects is held any more, by the store
// or the history: an object that outlives every other of its slab keeps
// the slab, at most slabSize, alive.
func PackBytes(objs []*Object) {
	for len(objs) > 0 {
		n, size := nextSlab(objs)
		slab := make([]byte, 0, size)
		for _, o := range objs[:n] {
			if packedLen(o) == 0 {
				continue
			}
			at, end := len(slab), len(slab)+len(o.Raw)
			slab = append(append(slab, o.Raw...), o.Key...)
			o.Raw = slab[at:end:end]
			if len(o.Key) > 0 {
				o.Key = unsafe.String(&slab[end], len(o.Key))
			}
		}
		objs = objs[n:]
	}
}

const (
	// largeAlloc is Go's small-object limit: an allocation above it is
	// rounded up to whole pages of pageSize, not to a size class.
	largeAlloc = 32 << 10
	pageSize   = 8 << 10
)

// packedLen is what an object takes in a slab, or 0 if it stays where it
// is: one above a quarter slab loses little to rounding, and has a span
// share of its own.
func packedLen(o *Object) int {
	if n := len(o.Raw) + len(o.Key); n <= slabSize/4 {
		return n
	}
	return 0
}

// nextSlab returns how many of objs go into the next slab, and its length:
// of the runs from objs[0] that fit in slabSize and are above largeAlloc,
// the one that loses the least, in proportion, to the rounding up to a
// page; or all of objs, if they fit. Filling a fixed slab instead loses its
// tail: at 10,952 bytes an object and its key, five fill 64 KiB and leave
// 10,776 bytes, 2 KiB an object (TestNextSlab).
func nextSlab(objs []*Object) (n, size int) {
	waste := 0
	sum := 0
	for i, o := range objs {
		m := packedLen(o)
		if sum+m > slabSize {
			break
		}
		sum += m
		if i == len(objs)-1 {
			return len(objs), sum // the rest fits: one slab, whatever it loses
		}
		if sum <= largeAlloc {
			continue
		}
		w := (sum+pageSize-1)/pageSize*pageSize - sum
		if n == 0 || w*size < waste*sum {
			n, size, waste = i+1, sum, w
		}
	}
	if n == 0 { // not reached while packedLen keeps to a quarter slab
		return 1, packedLen(objs[0])
	}
	return n, size
}

// keyInSlack returns raw cut to its length, and key copied into the room
// Go's size class left after raw in its allocation, if it fits there, so
// that the key takes no allocation of its own. raw must be the only slice
// of its array, as an encoder's copy is. The bytes after raw's length are
// never written again: raw's capacity ends at its length.
//
// An object's bytes are their own allocation when ingest builds it from a
// watch event, rounded up to a size class: 1,645 bytes of JSON take 1,792,
// room for a key of up to 147 (BenchmarkVersionCost, docs/architecture.md).
func keyInSlack(raw []byte, key string) ([]byte, string) {
	n := len(raw)
	if key == "" || cap(raw)-n < len(key) {
		return raw[:n:n], key
	}
	raw = append(raw, key...)
	return raw[:n:n], unsafe.String(&raw[n], len(key))
}
