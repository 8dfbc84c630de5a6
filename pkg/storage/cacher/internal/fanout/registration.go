package fanout

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// initialEvents is what a new watcher receives before the stream.
type initialEvents struct {
	snap store.Snapshot
	// indexed says that objs, the state's objects with the watcher's
	// trigger value in key order, are the watcher's candidates, instead of
	// snap's every object in the watcher's range.
	indexed bool
	objs    []*object.Object
	// endBookmark asks for the initial-events-end bookmark after the objects.
	endBookmark bool
}

// Start is where a watcher registered begins.
type Start struct {
	// Initial sends the matching objects of the current state first, then
	// the events after it; EndBookmark ends them with the
	// initial-events-end bookmark.
	Initial, EndBookmark bool
	// Without Initial the watcher starts after resourceVersion From, or at
	// the head with AtHead.
	AtHead bool
	From   uint64
}

// Register adds a watcher, starting where start says.
func (d *Dispatcher) Register(w *Watcher, start Start) (watch.Interface, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w.state == stopped {
		// Stopped before it started, by its context.
		return w, nil
	}
	if d.closed {
		// A watch that passed the cache's readiness as it stopped: nothing
		// would ever end it here.
		w.state = stopped
		close(w.ch)
		return nil, apierrors.NewServiceUnavailable("the watch cache is stopped")
	}
	since, head := d.log.Bounds()
	if w.bookmarks {
		d.scheduleBookmarkLocked(w, d.clock.Now())
	}
	switch {
	case start.Initial:
		snap := d.store.Latest()
		w.pos = history.At(snap.RV)
		init := &initialEvents{snap: snap, endBookmark: start.EndBookmark}
		if w.place.kind == byTrigger {
			// Under d.mu the store's indexes hold snap's state. An agent's
			// watch-list reads its own objects, not every object.
			init.objs, _, init.indexed = d.store.ByIndex(storage.FieldIndex(d.pres.trigger), w.place.value)
		}
		w.sizeFor(init)
		d.startCatchUpLocked(w, init)
	case start.AtHead:
		w.pos = history.At(head)
		d.addLocked(w)
	case start.From < since:
		w.state = stopped
		close(w.ch)
		return newErrWatcher(tooOld(start.From, since)), nil
	case start.From >= head:
		// Up to date, or a future resourceVersion: events up to it are skipped.
		w.pos, w.sent = history.At(start.From), start.From
		d.addLocked(w)
	default:
		w.pos, w.sent = history.At(start.From), start.From
		d.startCatchUpLocked(w, nil)
	}
	if d.shuttingDown {
		d.bookmarkNowLocked(w)
	}
	return w, nil
}

func tooOld(rv, since uint64) watch.Event {
	err := apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", rv, since))
	return watch.Event{Type: watch.Error, Object: &err.ErrStatus}
}

func (d *Dispatcher) addLocked(w *Watcher) {
	w.state = synced
	d.synced.add(w)
}

// remove is Stop's half in the dispatcher.
func (d *Dispatcher) remove(w *Watcher) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch w.state {
	case synced:
		d.synced.remove(w)
		w.state = stopped
		close(w.ch)
	case unregistered:
		w.state = stopped
		close(w.ch)
	}
	// A catching-up watcher's goroutine sees done and closes the channel.
}
