// Package compress keeps one object's bytes compressed on their own
// against a dictionary trained from the objects of its resource, so that
// any one can be read without its neighbours (issue 67). A Codec compresses
// with S2 or zstd (klauspost/compress), trains its dictionaries from
// sample objects laid end to end (which beat klauspost/compress/dict's
// builder on our corpus), and keeps the dictionaries older records need.
//
// # Record format
//
// Every record starts with a format byte and the CRC-32C of the object's
// bytes, so that a corrupted record is refused, never returned:
//
//	stored      0x00 │ CRC-32C, 4 B little-endian │ the object's bytes
//	S2          0x01 │ CRC-32C                    │ dictionary id, uvarint │ S2 block
//	zstd        0x02 │ CRC-32C                    │ dictionary id, uvarint │ zstd frame less its 4-byte magic
//
// A record is 5 bytes more than its object when stored, 6 more than its
// compressed payload while fewer than 128 dictionaries were trained.
// The checksum covers the object, not the record, so that a record that
// decodes to other bytes than were compressed (a corrupted payload, a
// wrong dictionary, a decoder's bug) is caught too. Dictionary id 0 is no
// dictionary: what Compress writes before the first Train. An object that
// does not compress is stored as it is.
//
// Records live only in the process's memory: the format needs no version,
// and a dictionary's id only names it within one Codec.
//
// # Dictionaries
//
// Train builds a dictionary from samples and makes it the one Compress
// uses; records compressed with older ones stay readable until Retire
// forgets them. Whoever holds the records knows when none needs a
// dictionary (DictionaryID); a record whose dictionary was retired is
// refused with ErrUnknownDictionary, as a corrupted one is, and is to be
// read again from etcd.
//
// # Concurrency
//
// Compress and Decompress never wait for each other, nor for Train: they
// read the dictionaries from an immutable table swapped atomically, and
// S2's dictionaries and zstd's encoders and decoders are safe for
// concurrent use. Train and Retire hold Codec.mu, which orders the
// writers of the table.
//
// Usage:
//
//	c, err := compress.New(compress.Config{Algorithm: compress.S2})
//	…
//	if _, err := c.Train(samples); err != nil { … } // in the background; the old dictionary serves until it returns
//	rec := c.Compress(nil, raw)
//	raw, err = c.Decompress(buf[:0], rec) // ErrCorrupt: read the object again
package compress
