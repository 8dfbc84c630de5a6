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
//
// A slab is freed when none of its objects is held any more, by the store
// or the history: an object that outlives every other of its slab keeps
// the slab, at most slabSize, alive.
func PackBytes(objs []*Object) {
	var slab []byte
	for _, o := range objs {
		n, k := len(o.Raw), len(o.Key)
		if n+k > slabSize/4 {
			continue // large enough to lose little to rounding, and to have a span share of its own
		}
		if len(slab)+n+k > cap(slab) {
			slab = make([]byte, 0, slabSize)
		}
		at := len(slab)
		slab = append(append(slab, o.Raw...), o.Key...)
		o.Raw = slab[at : at+n : at+n]
		if k > 0 {
			o.Key = unsafe.String(&slab[at+n], k)
		}
	}
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
