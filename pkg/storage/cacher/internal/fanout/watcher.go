package fanout

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// watcherState is where a watcher is in the dispatcher.
//
//	       register                 channel full
//	──────────────────▶ synced ─────────────────────▶ catchingUp
//	  (at head)           ▲      reached the log head     │
//	                      └───────────────────────────────┘
//	register (behind, or with initial events) ──────────▶ catchingUp
//	Stop, relist, or fell off the log ─────────────────▶ stopped
type watcherState uint8

const (
	// unregistered watchers are being set up.
	unregistered watcherState = iota
	// synced watchers are at the log head and receive events directly from
	// the dispatcher, without blocking.
	synced
	// catchingUp watchers are behind; one goroutine of their own feeds them
	// from the event log until they reach the head.
	catchingUp
	// stopped watchers have a closed channel.
	stopped
)

// Watcher is one watch. While synced it costs no goroutine: the struct and
// its channel buffer are all it holds.
type Watcher struct {
	d *Dispatcher

	// key and recursive select what the watch covers.
	key       string
	recursive bool
	// filter selects the objects the watch receives; nil selects everything.
	filter *Filter
	// place is where the dispatcher's index files the watcher while synced.
	place place
	// bookmarks is whether the watch asked for bookmarks.
	bookmarks bool
	// Deadline is when the server ends the watch, in Unix nanoseconds; zero
	// if never. A bookmark goes out shortly before it.
	Deadline int64

	// ch carries events to the consumer. It is closed by whoever feeds the
	// watcher when it stops: the dispatcher while synced, the catch-up
	// goroutine while catching up.
	ch chan watch.Event
	// done is closed by Stop.
	done     chan struct{}
	stopOnce sync.Once
	// unhookCtx detaches the context.AfterFunc that stops the watcher.
	unhookCtx atomic.Pointer[func() bool]
	// OnInitialized tells priority and fairness that the watcher's initial
	// events are sent; the catch-up goroutine calls it. Nil if nobody listens.
	OnInitialized func()
	// OnEnd is called once when the watcher ends; nil if nobody listens.
	OnEnd func()
	// shutdownBookmarked is set once the watcher was sent its shutdown
	// bookmark (see Shutdown); Begin reads it from its own goroutine.
	shutdownBookmarked atomic.Bool

	// The fields below are guarded by dispatcher.mu, except that pos is
	// owned by the catch-up goroutine while the state is catchingUp.

	state watcherState
	// pos is where the watcher is in the history: every event before it
	// was delivered or filtered out. It is after a whole revision but while
	// a catch-up is inside one.
	pos history.Pos
	// missed is, while the dispatcher offers a revision, the index in it of
	// the first event the watcher's full channel refused: it gets nothing
	// more of the revision from the dispatcher. -1 otherwise.
	missed int
	// sent is the newest resourceVersion the client holds: the last event or
	// bookmark it was sent, or the resourceVersion it watched from. A
	// periodic bookmark at sent would tell it nothing, and is not sent.
	sent uint64
	// set and index are the watcher's set in the index, while synced, and
	// its position there.
	set   *watcherSet
	index int
}

var _ watch.Interface = &Watcher{}

// ResultChan implements watch.Interface.
func (w *Watcher) ResultChan() <-chan watch.Event { return w.ch }

// Stop implements watch.Interface. It is safe to call more than once and
// from any goroutine.
func (w *Watcher) Stop() {
	if w.end() {
		w.d.remove(w)
	}
}

// end closes done, once, and detaches the context hook. It reports
// whether this call was the one that ended the watcher.
func (w *Watcher) end() bool {
	ended := false
	w.stopOnce.Do(func() {
		ended = true
		close(w.done)
		if unhook := w.unhookCtx.Load(); unhook != nil {
			(*unhook)()
		}
		if w.OnEnd != nil {
			w.OnEnd()
		}
	})
	return ended
}

// NewWatcher builds a watcher for a key and predicate. Its error is a 400
// for a shard selector the cache cannot read.
func NewWatcher(d *Dispatcher, key string, recursive bool, pred storage.SelectionPredicate, buffer int) (*Watcher, error) {
	f, err := NewFilter(pred)
	if err != nil {
		return nil, err
	}
	return &Watcher{d: d, key: key, recursive: recursive, filter: f, bookmarks: pred.AllowWatchBookmarks,
		place: placeFor(key, recursive, f, d.pres.trigger), missed: -1,
		ch: make(chan watch.Event, buffer), done: make(chan struct{})}, nil
}

// initialBuffer is the channel size of a watcher with that many initial
// events or more. The watch handler flushes its response whenever the
// channel is empty, and with watch-list compression (beta, on, in 1.37)
// each flush ends a gzip stream that the next write starts again, with new
// Huffman tables. With 10 events of room, the handler, which encodes
// nothing for ours, emptied the channel every few events: gzip's flushes
// were a third of the server's CPU while 100 watch-lists streamed, and the
// last ended 2.4× later than with this (docs/benchmarks.md, *What each of
// issue 27's changes bought*). Filled in the sender's turn, this one empties at
// its pauses. 256 events are 8 KiB, held only by watchers that stream at
// least as many objects; upstream's Cacher gives watchers up to 1,000.
const initialBuffer = 256

// sizeFor gives a watcher that is not yet handed out a channel with room
// for its initial events, up to initialBuffer, if its own has less.
func (w *Watcher) sizeFor(init *initialEvents) {
	n := len(init.objs)
	if !init.indexed {
		init.snap.Scan(w.key, w.recursive, "", func(*object.Object) bool {
			n++
			return n < initialBuffer
		})
	}
	if n = min(n, initialBuffer); n > cap(w.ch) {
		w.ch = make(chan watch.Event, n)
	}
}

// initialized reports that the initial events went out, or never will.
func (w *Watcher) initialized() {
	if w.OnInitialized != nil {
		w.OnInitialized()
	}
}

// drained reports whether the watcher was sent its shutdown bookmark and
// the consumer has taken everything sent so far, or whether it stopped.
func (w *Watcher) drained() bool {
	select {
	case <-w.done:
		return true
	default:
		return w.shutdownBookmarked.Load() && len(w.ch) == 0
	}
}

// endsBy reports whether the watch's deadline is at or before t.
func (w *Watcher) endsBy(t time.Time) bool { return w.Deadline != 0 && w.Deadline <= t.UnixNano() }

// covers reports whether the watch covers key.
func (w *Watcher) covers(key string) bool { return InScope(w.key, w.recursive, key) }

// Pending is how many events wait in the watcher's buffer for its
// consumer.
func (w *Watcher) Pending() int { return len(w.ch) }

// Sharded reports whether the watcher selects a shard of the objects.
func (w *Watcher) Sharded() bool { return w.filter != nil && w.filter.shard != nil }

// StopWith stops the watcher when ctx ends.
func (w *Watcher) StopWith(ctx context.Context) {
	unhook := context.AfterFunc(ctx, w.Stop)
	w.unhookCtx.Store(&unhook)
}

// InScope reports whether key falls under a request for prefix: below it
// when recursive, equal to it otherwise.
func InScope(prefix string, recursive bool, key string) bool {
	if recursive {
		return strings.HasPrefix(key, prefix)
	}
	return key == prefix
}

// send blocks until the consumer takes ev or the watcher stops. Only the
// catch-up goroutine uses it.
func (w *Watcher) send(ev watch.Event) bool {
	select {
	case <-w.done:
		return false
	default:
	}
	select {
	case w.ch <- ev:
		return true
	case <-w.done:
		return false
	}
}

// errWatcher is a watch that delivers one error event and ends, as for a
// resourceVersion that is too old.
type errWatcher struct {
	ch chan watch.Event
}

func newErrWatcher(ev watch.Event) *errWatcher {
	ch := make(chan watch.Event, 1)
	ch <- ev
	close(ch)
	return &errWatcher{ch: ch}
}

// ResultChan implements watch.Interface.
func (w *errWatcher) ResultChan() <-chan watch.Event { return w.ch }

// Stop implements watch.Interface.
func (w *errWatcher) Stop() {}
