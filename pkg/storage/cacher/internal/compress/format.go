package compress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// The format byte of a record (doc.go).
const (
	formatStored = 0x00
	formatS2     = 0x01
	formatZstd   = 0x02
)

// headerSize is a stored record's header: the format byte and the CRC.
const headerSize = 1 + crc32.Size

// castagnoli is CRC-32C's table: computed in hardware on amd64 and arm64,
// about 20 GB/s, a few tens of ns for an object of 1 KiB.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrCorrupt is what Decompress returns for a record that is not one
	// Compress wrote, or that does not decode to the bytes it was
	// compressed from.
	ErrCorrupt = errors.New("compress: corrupt record")
	// ErrUnknownDictionary is what Decompress returns for a record whose
	// dictionary this Codec never trained or has retired.
	ErrUnknownDictionary = errors.New("compress: unknown dictionary")
)

// header is a record's header, parsed.
type header struct {
	format byte
	crc    uint32
	// dict is the dictionary id; 0 for none, or a stored record.
	dict uint32
	// payload is what follows the header.
	payload []byte
}

// parseHeader reads rec's header; it does not look into the payload.
func parseHeader(rec []byte) (header, error) {
	if len(rec) < headerSize {
		return header{}, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorrupt, len(rec))
	}
	h := header{format: rec[0], crc: binary.LittleEndian.Uint32(rec[1:headerSize]), payload: rec[headerSize:]}
	switch h.format {
	case formatStored:
		return h, nil
	case formatS2, formatZstd:
	default:
		return header{}, fmt.Errorf("%w: format %#x", ErrCorrupt, h.format)
	}
	id, n := binary.Uvarint(h.payload)
	if n <= 0 || id > math.MaxUint32 {
		return header{}, fmt.Errorf("%w: dictionary id", ErrCorrupt)
	}
	h.dict, h.payload = uint32(id), h.payload[n:]
	return h, nil
}

// appendHeader appends a header of format, CRC crc and dictionary dict
// (ignored for a stored record) to dst.
func appendHeader(dst []byte, format byte, crc uint32, dict uint32) []byte {
	dst = append(dst, format)
	dst = binary.LittleEndian.AppendUint32(dst, crc)
	if format == formatStored {
		return dst
	}
	return binary.AppendUvarint(dst, uint64(dict))
}
