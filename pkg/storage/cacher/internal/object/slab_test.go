package object

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// TestPackBytes: packed objects keep their bytes and keys, each cut to its length so
// that nothing appends into a neighbour, side by side in slabs; large ones
// stay where they are.
func TestPackBytes(t *testing.T) {
	var objs []*Object
	var want [][]byte
	for i, n := range []int{100, 2000, 10_000, slabSize/4 + 1, 5, 16_000, 16_000, 16_000, 15_990} {
		raw := []byte(strings.Repeat(string(rune('a'+i)), n))
		objs = append(objs, &Object{Raw: raw, Key: fmt.Sprintf("/k/%d", i)})
		want = append(want, bytes.Clone(raw))
	}
	objs[4].Key = ""
	large := objs[3].Raw
	PackBytes(objs)
	for i, o := range objs {
		if !bytes.Equal(o.Raw, want[i]) || (i != 3 && cap(o.Raw) != len(o.Raw)) {
			t.Errorf("object %d: %d bytes, capacity %d, equal %v", i, len(o.Raw), cap(o.Raw), bytes.Equal(o.Raw, want[i]))
		}
		if wantKey := fmt.Sprintf("/k/%d", i); i != 4 && o.Key != wantKey {
			t.Errorf("object %d: key %q, want %q", i, o.Key, wantKey)
		}
		if i != 3 && i != 4 && unsafe.StringData(o.Key) != (*byte)(unsafe.Add(unsafe.Pointer(&o.Raw[0]), len(o.Raw))) {
			t.Errorf("object %d: the key is not beside the bytes", i)
		}
	}
	if &objs[3].Raw[0] != &large[0] {
		t.Error("an object above a quarter slab was moved")
	}
	next := func(i, j int) bool {
		// Addresses as numbers: the end of a slab's last object is one past
		// its allocation, which checkptr forbids as a pointer.
		end := uintptr(unsafe.Pointer(&objs[i].Raw[0])) + uintptr(len(objs[i].Raw)+len(objs[i].Key))
		return end == uintptr(unsafe.Pointer(&objs[j].Raw[0]))
	}
	// Side by side with their keys, past the large one too, until a slab
	// is full: 12,105 + 3 × 16,000 bytes and keys fit in 64 KiB, a fourth
	// 15,990 and its key do not.
	for _, pair := range [][2]int{{0, 1}, {1, 2}, {2, 4}, {4, 5}, {5, 6}, {6, 7}} {
		if !next(pair[0], pair[1]) {
			t.Errorf("objects %d and %d are not side by side", pair[0], pair[1])
		}
	}
	if next(7, 8) {
		t.Error("a full slab took another object")
	}
}

// TestKeyInSlack checks that a key goes into the room after an object's
// bytes when it fits, that the bytes end where they did, and that nothing
// else is touched.
func TestKeyInSlack(t *testing.T) {
	for _, tc := range []struct {
		name     string
		len, cap int
		key      string
		inSlack  bool
	}{
		{"fits", 1645, 1792, "/registry/fleet.example.com/assignments/ns-1/a-000001", true},
		{"fits exactly", 10, 14, "/a/b", true},
		{"one byte short", 10, 13, "/a/b", false},
		{"no room", 16, 16, "/a/b", false},
		{"no key", 10, 16, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := make([]byte, tc.len, tc.cap)
			for i := range raw {
				raw[i] = 'x'
			}
			key := strings.Clone(tc.key)
			gotRaw, gotKey := keyInSlack(raw, key)
			if gotKey != tc.key || len(gotRaw) != tc.len || cap(gotRaw) != tc.len || &gotRaw[0] != &raw[0] {
				t.Fatalf("got %d bytes (capacity %d) and key %q", len(gotRaw), cap(gotRaw), gotKey)
			}
			if !bytes.Equal(gotRaw, bytes.Repeat([]byte("x"), tc.len)) {
				t.Error("the bytes changed")
			}
			inSlack := tc.key != "" && tc.cap > tc.len && unsafe.StringData(gotKey) == &raw[:tc.cap][tc.len]
			if inSlack != tc.inSlack {
				t.Errorf("key in the slack: %v, want %v", inSlack, tc.inSlack)
			}
		})
	}
}

// TestNextSlab: the slabs a list's page is packed into lose little to Go's
// rounding of a large allocation up to a page, whatever the objects'
// length, and never more than filling fixed slabs of 64 KiB did.
func TestNextSlab(t *testing.T) {
	mixed := make([]int, 600)
	for i := range mixed {
		mixed[i] = 600 + (i*7919)%15_000
	}
	for _, tc := range []struct {
		name    string
		lens    []int // of an object's bytes and key
		maxLost float64
	}{
		// 1 KiB of annotation and a key, as bench-scale's objects.
		{"1,697 B", slices.Repeat([]int{1_697}, 600), 0.01},
		// 10 KiB: five fill 64 KiB and leave 10,776 bytes.
		{"10,952 B", slices.Repeat([]int{10_952}, 600), 0.05},
		{"4,052 B", slices.Repeat([]int{4_052}, 600), 0.02},
		// Four fill 57,352 bytes, eight past 7 pages: no run loses less
		// than an eighth, as fixed slabs did.
		{"14,338 B", slices.Repeat([]int{14_338}, 600), 0.15},
		{"mixed", mixed, 0.05},
		{"a quarter slab", slices.Repeat([]int{slabSize / 4}, 600), 0},
		{"large and small", []int{40_000, 100, 40_000, 200, 50_000}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := make([]*Object, len(tc.lens))
			for i, n := range tc.lens {
				objs[i] = &Object{Raw: make([]byte, n)}
			}
			var total, lost int
			for rest := objs; len(rest) > 0; {
				n, size := nextSlab(rest)
				want := 0
				for _, o := range rest[:n] {
					want += packedLen(o)
				}
				if n < 1 || size != want || size > slabSize {
					t.Fatalf("a slab of %d objects and %d bytes (theirs: %d)", n, size, want)
				}
				if size > largeAlloc {
					lost += (size+pageSize-1)/pageSize*pageSize - size
				}
				total += size
				rest = rest[n:]
			}
			if got := float64(lost) / float64(max(total, 1)); got > tc.maxLost || got > fixedSlabsLost(tc.lens) {
				t.Errorf("%.1f%% of %d bytes lost to rounding, want at most %.1f%% and at most fixed slabs' %.1f%%",
					100*got, total, 100*tc.maxLost, 100*fixedSlabsLost(tc.lens))
			}
		})
	}
}

// fixedSlabsLost is what filling slabs of slabSize one after another loses,
// as PackBytes did until 2026-11-26.
func fixedSlabsLost(lens []int) float64 {
	var bytes, slabs, left int
	for _, n := range lens {
		if n > slabSize/4 {
			continue
		}
		if n > left {
			slabs, left = slabs+1, slabSize
		}
		left -= n
		bytes += n
	}
	if bytes == 0 {
		return 0
	}
	return float64(slabs*slabSize-bytes) / float64(bytes)
}
