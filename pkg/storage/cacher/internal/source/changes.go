package source

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// Changes is etcd's record of the resource's changes, read a whole
// revision at a time. etcd gives one revision to every key a transaction
// or a lease revocation changes, and sends a revision's events in one
// watch response; the etcd3 store's Watch hands them out one at a time,
// so that a reader of it cannot tell where a revision ends (issue 56).
type Changes interface {
	// Watch follows the changes after rev until ctx ends, the stream is
	// closed, or the watch fails: then its last response says why.
	Watch(ctx context.Context, rev uint64) ChangeStream
}

// ChangeStream is one etcd watch.
type ChangeStream interface {
	// Responses delivers the watch's responses in etcd's order, and is
	// closed after the last one.
	Responses() <-chan Response
	// RequestProgress asks etcd for a progress notification on this
	// watch's own gRPC stream, without waiting for it.
	RequestProgress(ctx context.Context) error
	// Close ends the watch and its stream. It is safe to call twice.
	Close()
}

// Response is one etcd watch response.
type Response struct {
	// Changes are whole revisions, in etcd's order.
	Changes []Change
	// Progress, if not zero, is the revision of a progress notification:
	// the watch has delivered every change up to it.
	Progress uint64
	// End, if set, is why the watch ended; nothing follows it.
	End *End
	// Decoded is when the response's values were decoded, for the
	// dispatch latency; zero if unknown.
	Decoded time.Time
}

// Change is one key's change.
type Change struct {
	// Key is the object's key in the storage, as the registry's KeyFunc
	// makes it.
	Key string
	// Rev is the revision of the change.
	Rev uint64
	// Deleted is whether the key was deleted; otherwise it was put.
	Deleted bool
	// Object is the new object, or for a deletion the last one, both at
	// Rev. It is nil for a deletion whose last value etcd did not send or
	// that did not decode: the cache then uses the one it holds.
	Object runtime.Object
	// Held, set instead of Object, is the cache's own object for a put of
	// a version the cache already holds, which was not read again.
	Held *object.Object
}

// revisions calls fn with each revision of changes, in order: the
// changes that share a revision.
func revisions(changes []Change, fn func([]Change) error) error {
	for len(changes) > 0 {
		n := 1
		for n < len(changes) && changes[n].Rev == changes[0].Rev {
			n++
		}
		if err := fn(changes[:n]); err != nil {
			return err
		}
		changes = changes[n:]
	}
	return nil
}
