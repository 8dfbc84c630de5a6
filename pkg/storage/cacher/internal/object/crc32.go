package object

// The CRC-32 (IEEE) of bytes a followed by bytes b, from the CRC-32 of
// each and the length of b, as zlib's crc32_combine computes it: a gzip
// stream sends a run compressed once with the CRC-32 it found then, and
// its trailer holds the CRC-32 of everything sent. Read from the frames at
// every send instead, it took a quarter of a list's CPU once the runs were
// shared (docs/benchmarks.md). hash/crc32 has no combine.

// ieeeReversed is the IEEE polynomial, bit-reversed, as hash/crc32.IEEE.
const ieeeReversed = 0xedb88320

// x2n holds x^(2^k) modulo the polynomial, for k = 0 to 31.
var x2n = func() (t [32]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multModP(p, p)
	}
	return t
}()

// multModP multiplies a and b modulo the polynomial, in the reversed bit
// order CRCs are in: x^0 is the top bit.
func multModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ ieeeReversed
		} else {
			b >>= 1
		}
	}
	return p
}

// crc32Combine returns the CRC-32 of a followed by b, given the CRC-32 of
// a and of b, and b's length.
func crc32Combine(crcA, crcB uint32, lenB int) uint32 {
	// crcA times x^(8·lenB): shifted past b's bits.
	p := uint32(1) << 31 // x^0
	k := 3               // x^(8n) = x^(n·2^3)
	for n := uint64(lenB); n != 0; n >>= 1 {
		if n&1 != 0 {
			p = multModP(x2n[k&31], p)
		}
		k++
	}
	return multModP(p, crcA) ^ crcB
}
