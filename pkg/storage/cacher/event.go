package cacher

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// eventLog is the history of events every watcher reads.
type eventLog = history.Log[*event]

// eventStore is the current objects and their snapshots.
type eventStore = store.Store[*event]

// event is one change from etcd, shared by every watcher that receives it.
type event struct {
	typ watch.EventType
	key string
	rv  uint64
	// cur is the new state for ADDED and MODIFIED, and the last state at the
	// deletion's resourceVersion for DELETED.
	cur *object.Object
	// prev is the state before the change; nil for ADDED.
	prev *object.Object
	// recorded is when ingest saw the event; the log keeps it for the history window.
	recorded time.Time
	// decoded is when the etcd3 store decoded the event from etcd's watch,
	// the start of its dispatch latency, and received when ingest took it,
	// in Unix nanoseconds of the real clock; zero when the store did not say.
	decoded, received int64

	// leaving is prev at this event's resourceVersion, built once for the
	// watchers this event moves out of their selector.
	leavingOnce sync.Once
	leaving     *object.Caching
}

// RV is the event's resourceVersion, for the history.
func (e *event) RV() uint64 { return e.rv }

// Recorded is when ingest saw the event, for the history window.
func (e *event) Recorded() time.Time { return e.recorded }

// Change is the event's type and the object versions after and before it,
// for the store.
func (e *event) Change() (watch.EventType, *object.Object, *object.Object) {
	return e.typ, e.cur, e.prev
}

// Size is what the event adds to the history: the object version it
// created. Its previous version is the one an earlier event, or the list,
// created.
func (e *event) Size() int64 {
	if e.cur == nil {
		return 0
	}
	return e.cur.Size()
}

// forWatcher returns what a watcher with filter f receives, following
// the Kubernetes rules for selectors: entering is ADDED, staying is
// MODIFIED, leaving is DELETED with the previous state at this event's
// resourceVersion. ok is false when the watcher receives nothing.
//
// m, if not nil, holds the fields of cur and prev for every watcher of a
// dispatch.
func (e *event) forWatcher(f *filter, v storage.Versioner, pr *presenter, m *eventFields) (watch.Event, bool) {
	var cf, pf *objectFields
	if m != nil {
		cf, pf = &m.cur, &m.prev
	}
	curMatch := e.typ != watch.Deleted && f.matches(e.cur, pr, cf)
	prevMatch := e.prev != nil && f.matches(e.prev, pr, pf)
	switch {
	case e.typ == watch.Deleted && prevMatch:
		return watch.Event{Type: watch.Deleted, Object: pr.caching(e.cur)}, true
	case curMatch && prevMatch:
		return watch.Event{Type: watch.Modified, Object: pr.caching(e.cur)}, true
	case curMatch:
		return watch.Event{Type: watch.Added, Object: pr.caching(e.cur)}, true
	case prevMatch:
		return watch.Event{Type: watch.Deleted, Object: e.leavingObject(v, pr)}, true
	}
	return watch.Event{}, false
}

func (e *event) leavingObject(v storage.Versioner, pr *presenter) *object.Caching {
	e.leavingOnce.Do(func() {
		o, err := e.prev.At(v, e.rv)
		if err != nil {
			// Only objects that cannot be decoded fail here, and ingest keeps none.
			klog.ErrorS(err, "Cannot set the resourceVersion of a DELETED event", "key", e.key)
			e.leaving = pr.caching(e.prev)
			return
		}
		e.leaving = object.NewCaching(o)
	})
	return e.leaving
}
