package fanout

import (
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// Log is the history of events every watcher reads.
type Log = history.Log[*Event]

// Store is the current objects and their snapshots.
type Store = store.Store[*Event]

// Event is one change from etcd, shared by every watcher that receives it.
type Event struct {
	Type watch.EventType
	// Key is the object's key in the storage.
	Key string
	// Rev is the event's resourceVersion: etcd's revision of the change.
	Rev uint64
	// Cur is the new state for ADDED and MODIFIED, and the last state at the
	// deletion's resourceVersion for DELETED.
	Cur *object.Object
	// Prev is the state before the change; nil for ADDED.
	Prev *object.Object
	// Seen is when ingest saw the event, in Unix nanoseconds of the
	// cache's clock; the log keeps it for the history window. Not a
	// time.Time: its 24 bytes and a sync.Once for leaving made the event
	// 128 bytes, not 96 (docs/architecture.md). The window is a duration
	// between wall times and needs no monotonic reading.
	Seen int64
	// Decoded is when the etcd3 store decoded the event from etcd's watch,
	// the start of its dispatch latency, and Received when ingest took it,
	// in Unix nanoseconds of the real clock; zero when the store did not say.
	Decoded, Received int64

	// leaving is prev at this event's resourceVersion, built for the
	// watchers this event moves out of their selector by the first of them.
	leaving atomic.Pointer[object.Caching]
}

// RV is the event's resourceVersion, for the history.
func (e *Event) RV() uint64 { return e.Rev }

// Recorded is when ingest saw the event, for the history window.
func (e *Event) Recorded() time.Time { return time.Unix(0, e.Seen) }

// Change is the event's type and the object versions after and before it,
// for the store.
func (e *Event) Change() (watch.EventType, *object.Object, *object.Object) {
	return e.Type, e.Cur, e.Prev
}

// Size is what the event adds to the history: the object version it
// created. Its previous version is the one an earlier event, or the list,
// created.
func (e *Event) Size() int64 {
	if e.Cur == nil {
		return 0
	}
	return e.Cur.Size()
}

// forWatcher returns what a watcher with filter f receives, following
// the Kubernetes rules for selectors: entering is ADDED, staying is
// MODIFIED, leaving is DELETED with the previous state at this event's
// resourceVersion. ok is false when the watcher receives nothing.
//
// m, if not nil, holds the fields of cur and prev for every watcher of a
// dispatch.
func (e *Event) forWatcher(f *Filter, v storage.Versioner, pr *Presenter, m *eventFields) (watch.Event, bool) {
	var cf, pf *objectFields
	if m != nil {
		cf, pf = &m.cur, &m.prev
	}
	curMatch := e.Type != watch.Deleted && f.Matches(e.Cur, pr, cf)
	prevMatch := e.Prev != nil && f.Matches(e.Prev, pr, pf)
	switch {
	case e.Type == watch.Deleted && prevMatch:
		return watch.Event{Type: watch.Deleted, Object: pr.caching(e.Cur)}, true
	case curMatch && prevMatch:
		return watch.Event{Type: watch.Modified, Object: pr.caching(e.Cur)}, true
	case curMatch:
		return watch.Event{Type: watch.Added, Object: pr.caching(e.Cur)}, true
	case prevMatch:
		return watch.Event{Type: watch.Deleted, Object: e.leavingObject(v, pr)}, true
	}
	return watch.Event{}, false
}

func (e *Event) leavingObject(v storage.Versioner, pr *Presenter) *object.Caching {
	if co := e.leaving.Load(); co != nil {
		return co
	}
	// Watchers that reach it at once may each build it: the same bytes,
	// and the first stored is what every one of them gets.
	var co *object.Caching
	if o, err := e.Prev.At(v, e.Rev); err != nil {
		// Only objects that cannot be decoded fail here, and ingest keeps none.
		klog.ErrorS(err, "Cannot set the resourceVersion of a DELETED event", "key", e.Key)
		co = pr.caching(e.Prev)
	} else {
		co = object.NewCaching(o)
	}
	if !e.leaving.CompareAndSwap(nil, co) {
		co = e.leaving.Load()
	}
	return co
}
