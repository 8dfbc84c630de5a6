package object

// slabSize is the most bytes of objects one slab holds: above Go's 32 KiB
// small-object limit, so that a slab has a span of its own.
const slabSize = 64 << 10

// PackBytes moves the bytes of a listed page's objects into slabs, side by
// side, each object's slice cut to its length.
//
// Go's heap never moves an object, and a span of one size class is free
// only once every slot in it is. Made one by one while a page is read, the
// objects' bytes fall among the page's garbage of the same size classes:
// etcd's values, of almost the same length, and the decoder's buffers.
// Packed, at 100,000 objects of 1 KiB the heap in use after a cold start
// went from 2,717 to 2,578 bytes an object, and in a later same-run A/B
// from 2,715 to 2,490 (docs/benchmarks.md, "What each mechanism buys"). Packing
// the objects' records and keys as well changed nothing measurable.
//
// A slab is freed when none of its objects is held any more, by the store
// or the history: an object that outlives every other of its slab keeps
// the slab, at most slabSize, alive.
func PackBytes(objs []*Object) {
	var slab []byte
	for _, o := range objs {
		n := len(o.Raw)
		if n > slabSize/4 {
			continue // large enough to lose little to rounding, and to have a span share of its own
		}
		if len(slab)+n > cap(slab) {
			slab = make([]byte, 0, slabSize)
		}
		at := len(slab)
		slab = append(slab, o.Raw...)
		o.Raw = slab[at : at+n : at+n]
	}
}
