package object

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCRC32Combine: the CRC-32 of two byte strings combined is that of
// their concatenation, for empty strings and long ones.
func TestCRC32Combine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ a, b int }{{0, 0}, {0, 5}, {5, 0}, {1, 1}, {100, 3}, {3, 100_000}, {70_000, 1 << 20}} {
		a, b := make([]byte, tc.a), make([]byte, tc.b)
		for i := range a {
			a[i] = byte(r.Uint32())
		}
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		want := crc32.ChecksumIEEE(append(a, b...))
		if got := crc32Combine(crc32.ChecksumIEEE(a), crc32.ChecksumIEEE(b), len(b)); got != want {
			t.Errorf("%d and %d bytes: %08x, want %08x", tc.a, tc.b, got, want)
		}
	}
}
