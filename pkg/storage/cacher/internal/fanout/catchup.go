package fanout

import (
	"time"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/gate"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// A watcher whose channel is full is parked: a goroutine of its own feeds
// it from the shared event log at its consumer's pace (catchUp) until it
// reaches the head and trySync hands it back to the synced set. A new
// watcher with initial events starts here too, behind the gate.

// catchUpBatch is how many events a catching-up watcher copies out of the
// log per lock acquisition.
const catchUpBatch = 256

// parkLocked moves a synced watcher to catching up from pos, or from where
// it was if that is later (a watch from a resourceVersion ahead of the
// cache).
func (d *Dispatcher) parkLocked(w *Watcher, pos history.Pos) {
	d.synced.remove(w)
	w.missed = -1
	if w.pos.Before(pos) {
		w.pos = pos
	}
	d.startCatchUpLocked(w, nil)
}

func (d *Dispatcher) startCatchUpLocked(w *Watcher, init *initialEvents) {
	w.state = catchingUp
	d.lagging[w] = struct{}{}
	go d.catchUp(w, init)
}

// catchUp feeds a watcher from the log at its consumer's pace until it
// reaches the head. It owns the watcher until trySync hands it back: from
// then on the dispatcher may park it again and start another catch-up, so
// this goroutine must not touch it.
func (d *Dispatcher) catchUp(w *Watcher, init *initialEvents) {
	if init != nil {
		ok := d.sendInitial(w, init)
		w.initialized()
		if !ok {
			d.endCatchUp(w)
			return
		}
	}
	replayed := 0
	for {
		events, next, ok := d.log.After(w.pos, catchUpBatch)
		if !ok {
			since, _ := d.log.Bounds()
			w.send(tooOld(w.pos.RV, since))
			d.metrics.Terminated.Inc()
			d.endCatchUp(w)
			return
		}
		replayed += len(events)
		for _, e := range events {
			if !w.covers(e.Key) {
				continue
			}
			if ev, ok := e.forWatcher(w.filter, d.versioner, d.pres, nil); ok {
				built := time.Now()
				if !w.send(ev) {
					d.endCatchUp(w)
					return
				}
				w.sent = e.Rev
				d.observeDelivered(e, 1, built)
			}
		}
		w.pos = next
		if len(events) == catchUpBatch {
			continue
		}
		if d.owesShutdownBookmark(w) {
			// At its position: everything up to it was delivered. Sent here,
			// where the send can wait for room, not by trySync, which holds
			// the dispatcher's lock.
			if !w.send(watch.Event{Type: watch.Bookmark, Object: d.BookmarkObject(w.pos.RV, false)}) {
				d.endCatchUp(w)
				return
			}
			w.sent = w.pos.RV
			w.shutdownBookmarked.Store(true)
		}
		if d.trySync(w) {
			d.metrics.Lag.Observe(float64(replayed))
			return
		}
	}
}

// sendInitial streams a snapshot to a new watcher, in its turns at the gate.
func (d *Dispatcher) sendInitial(w *Watcher, init *initialEvents) bool {
	turn, ok := d.gate.Enter(gate.Stream{Events: w.ch, Done: w.done}, d.metrics.InitWaiting)
	defer turn.Leave()
	if !ok {
		return false
	}
	sent := 0
	each := func(o *object.Object) bool {
		if w.filter.Matches(o, d.pres, nil) {
			ok = turn.Send(watch.Event{Type: watch.Added, Object: d.pres.caching(o)})
			sent++
		}
		return ok
	}
	if init.indexed {
		for _, o := range init.objs {
			if w.covers(o.Key) && !each(o) {
				break
			}
		}
	} else {
		init.snap.Scan(w.key, w.recursive, "", each)
	}
	d.metrics.InitEvents.Add(float64(sent))
	if ok && init.endBookmark {
		if ok = turn.Send(watch.Event{Type: watch.Bookmark, Object: d.BookmarkObject(init.snap.RV, true)}); ok {
			w.sent = init.snap.RV
		}
	}
	return ok
}

// trySync moves a caught-up watcher back to the synced set, or ends it if
// it was stopped. It reports whether the catch-up goroutine is done; if so
// the goroutine no longer owns the watcher.
func (d *Dispatcher) trySync(w *Watcher) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-w.done:
		d.endCatchUpLocked(w)
		return true
	default:
	}
	// Appends happen under mu, so no event can arrive between this check
	// and the move. A watcher that fell off the log goes round once more
	// and gets its 410 there.
	if events, _, ok := d.log.After(w.pos, 1); !ok || len(events) > 0 {
		return false
	}
	if d.shuttingDown && w.bookmarks && !w.shutdownBookmarked.Load() {
		// Shutdown began after the catch-up looked: it goes round once
		// more and sends the bookmark, waiting for room if it must.
		return false
	}
	delete(d.lagging, w)
	d.addLocked(w)
	return true
}

// endCatchUp closes the channel of a watcher whose catch-up ended without
// syncing. Only the goroutine that owns the watcher calls it.
func (d *Dispatcher) endCatchUp(w *Watcher) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.endCatchUpLocked(w)
}

func (d *Dispatcher) endCatchUpLocked(w *Watcher) {
	delete(d.lagging, w)
	w.state = stopped
	close(w.ch)
}
