package cacher

import (
	"context"
	"fmt"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/compress"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/packer"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// Compression is how a cache keeps its objects at rest (Config.Compression).
//
// With CompressionS2 each object is compressed on its own, so that any one
// is read without its neighbours, with S2 against a dictionary of 64 KiB
// trained from about 1,000 of the resource's objects when the cache is
// first ready; about a quarter of the JSON on objects shaped like a real
// cluster's, decompressed in about 1 µs (docs/benchmarks.md). A version
// is compressed in the background once it is older than the history
// window: what watchers are sent as it happens is read as before. The
// cache retrains in the background when its objects compress a quarter
// worse than after the last training, and never pauses serving for it.
// Every read decompresses (lists and watch-lists into the response), and
// a record whose CRC-32C does not match is never served: the cache lists
// again. Sizes, budgets and estimates count the uncompressed bytes, and
// nothing shows a compressed size (docs/architecture.md, "Objects
// compressed at rest").
//
// zstd is not offered: klauspost/compress's takes 3.5-4 µs to decompress
// an object, over the 2 µs a read may spend, for records a fifth smaller
// (BenchmarkCodec).
type Compression string

// The compressions.
const (
	CompressionOff Compression = "off"
	CompressionS2  Compression = "s2"
)

// Compressions are the values Config.Compression takes, for flags.
var Compressions = []Compression{CompressionOff, CompressionS2}

// newCompression returns the codec and the packer of a cache that
// compresses, or nils.
func (c *Cacher) newCompression() (*compress.Codec, error) {
	if c.cfg.Compression != CompressionS2 {
		return nil, nil
	}
	cc, err := compress.New(compress.Config{Algorithm: compress.S2})
	if err != nil {
		return nil, fmt.Errorf("cacher: compression: %w", err)
	}
	c.corrupt = &corruption{wake: c.requestProgress}
	return cc, nil
}

// startPacker starts the packer once the cache is first ready (when it
// compresses and Config.compressEvery allows).
func (c *Cacher) startPacker(ctx context.Context, cc *compress.Codec) {
	if cc == nil {
		return
	}
	window := c.cfg.HistoryWindow
	switch {
	case c.cfg.compressWindow < 0:
		window = 0
	case c.cfg.compressWindow > 0:
		window = c.cfg.compressWindow
	}
	c.packer = packer.New(packer.Config{Objects: c.store, Codec: cc, Window: window,
		Interval: c.cfg.compressEvery, Clock: c.cfg.Clock})
	if c.cfg.compressEvery < 0 {
		return
	}
	go func() {
		for {
			state, changed := c.ready.Get()
			if state == source.Ready {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
		c.packer.Run(ctx)
	}()
}

// corrupted is what the cache's objects tell of a read of compressed bytes
// that did not decompress to what they were made from: the read refused
// them, and the cache lists again, which builds every object anew from
// etcd and ends every watcher. A corrupt object is kept by nothing a
// re-list keeps: the store and the history are replaced whole.
func (c *Cacher) corrupted(o *object.Object, err error) {
	c.metrics.corrupt.Inc()
	klog.ErrorS(err, "The watch cache holds an object whose compressed bytes are corrupt; it refused them and lists again",
		"resource", c.cfg.GroupResource, "key", o.Key, "resourceVersion", o.RV)
	if c.corrupt != nil {
		c.corrupt.found(err)
	}
}

// corruption ends the cache's etcd watch with a re-list once a corrupt
// object was found (Cacher.corrupted): it wraps the changes the source
// follows, and the next time the source reads the watch's responses,
// their channel holds only the end. The source reads the channel anew each
// time it waits for a response, and wake, which asks for a progress
// notification, makes it wait anew at once.
type corruption struct {
	changes source.Changes
	wake    func()
	// err is the corruption found and not yet taken by a watch.
	err atomic.Pointer[error]
}

// found records err and wakes the source.
func (c *corruption) found(err error) {
	c.err.CompareAndSwap(nil, &err)
	c.wake()
}

// Watch implements source.Changes.
func (c *corruption) Watch(ctx context.Context, rev uint64) source.ChangeStream {
	return &corruptStream{ChangeStream: c.changes.Watch(ctx, rev), c: c}
}

// corruptStream is one etcd watch that ends once a corruption is found.
type corruptStream struct {
	source.ChangeStream
	c *corruption
	// end holds the end, once this stream took the corruption. Only the
	// source's goroutine reads the responses.
	end chan source.Response
}

// Responses implements source.ChangeStream.
func (s *corruptStream) Responses() <-chan source.Response {
	if s.end == nil {
		if err := s.c.err.Swap(nil); err != nil {
			s.end = make(chan source.Response, 1)
			s.end <- source.Response{End: &source.End{Reason: source.EndUnreadable, Relist: true,
				Err: fmt.Errorf("a cached object is corrupt: %w", *err)}}
		}
	}
	if s.end != nil {
		return s.end
	}
	return s.ChangeStream.Responses()
}
