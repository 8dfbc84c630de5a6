package object

import (
	"bytes"
	"strings"
	"testing"
	"unsafe"
)

// TestPackBytes: packed objects keep their bytes, each cut to its length so
// that nothing appends into a neighbour, side by side in slabs; large ones
// stay where they are.
func TestPackBytes(t *testing.T) {
	var objs []*Object
	var want [][]byte
	for i, n := range []int{100, 2000, 10_000, slabSize/4 + 1, 5, 16_000, 16_000, 16_000, 16_000} {
		raw := []byte(strings.Repeat(string(rune('a'+i)), n))
		objs = append(objs, &Object{Raw: raw})
		want = append(want, bytes.Clone(raw))
	}
	large := objs[3].Raw
	PackBytes(objs)
	for i, o := range objs {
		if !bytes.Equal(o.Raw, want[i]) || (i != 3 && cap(o.Raw) != len(o.Raw)) {
			t.Errorf("object %d: %d bytes, capacity %d, equal %v", i, len(o.Raw), cap(o.Raw), bytes.Equal(o.Raw, want[i]))
		}
	}
	if &objs[3].Raw[0] != &large[0] {
		t.Error("an object above a quarter slab was moved")
	}
	next := func(i, j int) bool {
		return unsafe.Add(unsafe.Pointer(&objs[i].Raw[0]), len(objs[i].Raw)) == unsafe.Pointer(&objs[j].Raw[0])
	}
	// Side by side, past the large one too, until a slab is full:
	// 12,105 + 3 × 16,000 bytes fit in 64 KiB, a fourth 16,000 does not.
	for _, pair := range [][2]int{{0, 1}, {1, 2}, {2, 4}, {4, 5}, {5, 6}, {6, 7}} {
		if !next(pair[0], pair[1]) {
			t.Errorf("objects %d and %d are not side by side", pair[0], pair[1])
		}
	}
	if next(7, 8) {
		t.Error("a full slab took another object")
	}
}
