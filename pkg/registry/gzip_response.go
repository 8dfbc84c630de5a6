package registry

import (
	"context"
	"io"
	"net/http"

	"k8s.io/apimachinery/pkg/runtime"
)

// GzipResponse lets a list that the watch cache shares write its own
// compressed response, in which runs of the cache's objects are compressed
// once for every list that sends them (cacher.GzipStream), instead of the
// library's gzip of each response alone: two thirds of a list's CPU once
// its items are the cache's bytes (docs/benchmarks.md, Floors).
// pkg/apiserver's WithListGzip puts it in the context of a list request
// whose client accepts gzip.
type GzipResponse struct {
	// Header is the response's headers, which the library's writer sends
	// with the status.
	Header http.Header
	// NewStream returns a stream that writes gzip to w.
	NewStream func(w io.Writer) GzipItemStream
}

// GzipItemStream writes a gzip stream in which the cache's objects, as
// items of a list, may be compressed once for every list.
type GzipItemStream interface {
	io.Writer
	// WriteItem writes prefix and then item's bytes as a list's item,
	// which it reads only if it must (listItem's AppendItem): a run of
	// items that another list compressed is sent as that list sent it.
	WriteItem(prefix []byte, item runtime.Object) error
	Close() error
}

type gzipResponseKey struct{}

// WithGzipResponse returns ctx with g, for the list the request answers.
func WithGzipResponse(ctx context.Context, g *GzipResponse) context.Context {
	return context.WithValue(ctx, gzipResponseKey{}, g)
}

// GzipResponseFrom returns ctx's GzipResponse, or nil.
func GzipResponseFrom(ctx context.Context) *GzipResponse {
	g, _ := ctx.Value(gzipResponseKey{}).(*GzipResponse)
	return g
}
