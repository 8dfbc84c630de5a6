package cacher

import (
	"io"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// GzipStream writes a watch's or a list's response as one gzip member of
// deflate segments, in which runs of the watch event frames the cache
// encoded and holds, or of the cache's objects as a list's items
// (WriteItem), are compressed once for every response that sends them: the
// initial events of watch-lists, and lists. The frames must be written as the cache wrote
// them, not copies: it is how they are known. A list's items are known by
// their object versions, whose bytes are read, and decompressed, only for a
// run compressed now.
type GzipStream = object.GzipStream

// NewGzipStream returns a GzipStream writing to w.
func NewGzipStream(w io.Writer) *GzipStream { return object.NewGzipStream(w) }
