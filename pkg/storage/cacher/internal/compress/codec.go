package compress

import (
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/s2"
)

// Algorithm is the compressor a Codec uses.
type Algorithm uint8

// The algorithms, numbered as their records' format bytes.
const (
	S2   Algorithm = formatS2
	Zstd Algorithm = formatZstd
)

// Level is how hard a Codec compresses.
type Level uint8

// The levels.
const (
	// Fast is S2's Encode, or zstd's SpeedFastest.
	Fast Level = iota
	// Better is S2's EncodeBetter, or zstd's SpeedDefault.
	Better
)

// Config configures a Codec.
type Config struct {
	// Algorithm is S2 or Zstd. Required.
	Algorithm Algorithm
	// Level is Fast (the default) or Better.
	Level Level
	// DictSize is the size of the dictionaries Train builds, at most 64 KiB
	// for S2. Default DefaultDictSize.
	DictSize int
	// MaxSize is the largest object Decompress returns: a record that
	// claims more is refused as corrupt before anything is allocated for
	// it. Default DefaultMaxSize.
	MaxSize int
}

// DefaultDictSize is Config.DictSize's default: S2's largest, whose
// records were 15% smaller than 16 KiB's on the realistic corpus at the
// same speed; zstd's 112 KiB saved under 2% more (BenchmarkCodec,
// docs/benchmarks.md).
const DefaultDictSize = 64 << 10

// DefaultMaxSize is Config.MaxSize's default: far above etcd's largest
// value (1.5 MiB by default) and what a server lets a client write.
const DefaultMaxSize = 64 << 20

// minGain is the share of an object its compression must save for the
// record to be compressed: below it, every read would pay a decompression
// for almost nothing. It is where S2 itself gives up on a block.
const minGain = 32 // 1/32

// Codec compresses objects one at a time, each against the dictionary
// trained last, and decompresses them against the one they were
// compressed with. It is safe for concurrent use (doc.go).
type Codec struct {
	cfg Config
	// table is the dictionaries, swapped whole; readers never lock.
	table atomic.Pointer[table]
	// mu orders Train and Retire, the writers of table, and guards nextID.
	mu sync.Mutex
	// nextID is the id Train gives the next dictionary.
	nextID uint32
}

// table is the dictionaries a Codec decompresses with. It is never
// changed once published.
type table struct {
	// current is what Compress uses: the dictionary trained last, or id 0.
	current *Dictionary
	// all holds every dictionary not retired, current among them, by id.
	all []*Dictionary
}

// none returns the empty dictionary, id 0, which every table holds.
func (t *table) none() *Dictionary {
	if t.current.id == 0 {
		return t.current
	}
	return t.find(0)
}

// find returns dictionary id, or nil.
func (t *table) find(id uint32) *Dictionary {
	for _, d := range t.all {
		if d.id == id {
			return d
		}
	}
	return nil
}

// New returns a Codec for cfg, its defaults filled in, that compresses
// without a dictionary until Train gives it one.
func New(cfg Config) (*Codec, error) {
	if cfg.DictSize == 0 {
		cfg.DictSize = DefaultDictSize
	}
	if cfg.MaxSize == 0 {
		cfg.MaxSize = DefaultMaxSize
	}
	if cfg.Level > Better {
		return nil, fmt.Errorf("compress: unknown level %d", cfg.Level)
	}
	if cfg.DictSize < 0 || cfg.MaxSize < 0 {
		return nil, errors.New("compress: negative DictSize or MaxSize")
	}
	if cfg.Algorithm == S2 && cfg.DictSize > s2.MaxDictSize {
		return nil, fmt.Errorf("compress: S2's dictionaries are at most %d bytes, not %d", s2.MaxDictSize, cfg.DictSize)
	}
	none, err := newDictionary(cfg, 0, nil, fromSamples)
	if err != nil {
		return nil, err
	}
	c := &Codec{cfg: cfg, nextID: 1}
	c.table.Store(&table{current: none, all: []*Dictionary{none}})
	return c, nil
}

// Compress appends src's record to dst and returns it: compressed against
// the current dictionary, or stored as it is when that would not save a
// 32nd of it. It may grow dst by S2's or zstd's bound for src, more than
// the record takes: what keeps the record compresses into a scratch buffer
// and keeps a copy of the record's size.
func (c *Codec) Compress(dst, src []byte) []byte {
	rec, _ := c.CompressTo(dst, src)
	return rec
}

// Decompress appends the object of record rec to dst and returns it. A
// record that is not one this Codec wrote, or that does not decode to the
// bytes it was made from, is refused with ErrCorrupt; one whose dictionary
// was retired, with ErrUnknownDictionary. On error dst is returned as it
// was.
func (c *Codec) Decompress(dst, rec []byte) ([]byte, error) {
	return c.decompress(dst, rec, c.table.Load().find)
}

// decompress is Decompress, the dictionary of a record's id found by find
// (nil: unknown).
func (c *Codec) decompress(dst, rec []byte, find func(id uint32) *Dictionary) ([]byte, error) {
	h, err := parseHeader(rec)
	if err != nil {
		return dst, err
	}
	at := len(dst)
	switch {
	case h.format == formatStored:
		dst = append(dst, h.payload...)
	case h.format != byte(c.cfg.Algorithm):
		return dst, fmt.Errorf("%w: format %#x in a codec of %#x", ErrCorrupt, h.format, byte(c.cfg.Algorithm))
	default:
		d := find(h.dict)
		if d == nil {
			return dst, fmt.Errorf("%w: %d", ErrUnknownDictionary, h.dict)
		}
		if dst, err = d.decode(dst, h.payload, c.cfg.MaxSize); err != nil {
			return dst[:at], fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
	}
	if crc32.Checksum(dst[at:], castagnoli) != h.crc {
		return dst[:at], fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return dst, nil
}

// Train builds a dictionary from samples, objects of the resource, and
// makes it the one Compress uses; it returns the dictionary's id. Compress
// and Decompress go on with the dictionaries they had while it runs: about
// a millisecond for S2, which reads only the last DictSize bytes of
// samples; for zstd, which compresses every sample to learn its entropy
// tables, 0.05–2.5 s for 5,000 objects (BenchmarkCodec, train-ms). With too
// little to make a dictionary of it fails, and the current one stays.
func (c *Codec) Train(samples [][]byte) (uint32, error) {
	return c.train(samples, fromSamples)
}

// train is Train, the dictionary's content chosen as how says.
func (c *Codec) train(samples [][]byte, how trainer) (uint32, error) {
	if len(samples) == 0 {
		return 0, errors.New("compress: no samples to train on")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.nextID
	d, err := newDictionary(c.cfg, id, samples, how)
	if err != nil {
		return 0, err
	}
	c.nextID++
	old := c.table.Load()
	c.table.Store(&table{current: d, all: append(slices.Clip(old.all), d)})
	return id, nil
}

// Retire forgets dictionary id, once no record that needs it will be read
// again: such a record is then refused with ErrUnknownDictionary. The
// current dictionary, and the empty one (id 0), cannot be retired; Retire
// returns whether id was.
func (c *Codec) Retire(id uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.table.Load()
	if id == 0 || old.current.id == id || old.find(id) == nil {
		return false
	}
	all := slices.DeleteFunc(slices.Clone(old.all), func(d *Dictionary) bool { return d.id == id })
	c.table.Store(&table{current: old.current, all: all})
	return true
}

// CompressTo is Compress, and returns the dictionary the record needs as
// well: the one it was compressed against, or the Codec's empty one (id 0)
// for a record kept as it is. Whoever keeps the record beside it reads it
// with DecompressWith, even after Retire forgot the dictionary, and the
// dictionary is collected with the last record that needs it.
func (c *Codec) CompressTo(dst, src []byte) ([]byte, *Dictionary) {
	crc := crc32.Checksum(src, castagnoli)
	at := len(dst)
	t := c.table.Load()
	d := t.current
	dst = appendHeader(dst, byte(c.cfg.Algorithm), crc, d.id)
	dst, ok := d.encode(dst, src, c.cfg.Level)
	if ok && len(dst)-at <= len(src)-len(src)/minGain {
		return dst, d
	}
	dst = appendHeader(dst[:at], formatStored, crc, 0)
	return append(dst, src...), t.none()
}

// DecompressWith is Decompress of a record that CompressTo said needs d,
// which need not be in the Codec's table any more. A record that names
// another dictionary than d is refused with ErrCorrupt.
func (c *Codec) DecompressWith(dst, rec []byte, d *Dictionary) ([]byte, error) {
	return c.decompress(dst, rec, func(id uint32) *Dictionary {
		if d == nil || d.id != id {
			return nil
		}
		return d
	})
}

// Current returns the dictionary Compress uses now: a record compressed
// against another one (but the empty one, id 0) is one a retrain left behind.
func (c *Codec) Current() *Dictionary { return c.table.Load().current }

// ID is the dictionary's id within its Codec: 0 for none.
func (d *Dictionary) ID() uint32 { return d.id }

// Len returns the length of the object rec holds, without decompressing
// it: what Decompress would append. A record whose length cannot be read
// is refused with ErrCorrupt.
func Len(rec []byte) (int, error) {
	h, err := parseHeader(rec)
	if err != nil {
		return 0, err
	}
	switch h.format {
	case formatStored:
		return len(h.payload), nil
	case formatS2:
		n, err := s2.DecodedLen(h.payload)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return n, nil
	}
	return zstdLen(h.payload)
}

// DictionaryID returns the id of the dictionary rec needs, 0 for none,
// for whoever counts the records that need each.
func DictionaryID(rec []byte) (uint32, error) {
	h, err := parseHeader(rec)
	return h.dict, err
}
