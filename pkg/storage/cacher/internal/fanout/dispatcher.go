package fanout

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	upstream "k8s.io/apiserver/pkg/storage/cacher/metrics"
	"k8s.io/utils/clock"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/gate"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// Dispatcher fans events out to watchers, with this slow-consumer policy:
//
//   - A synced watcher is at the log head. The Dispatcher offers it each
//     event without blocking. Nobody waits for a slow consumer.
//   - When a synced watcher's channel is full, the event is not dropped:
//     the watcher is parked at its cursor and a goroutine of its own feeds
//     it from the shared event log, at the consumer's pace, until it reaches
//     the head and is synced again. Events are never copied per watcher.
//   - Only a watcher whose cursor falls off the log's tail, because the log
//     no longer holds the events after it, is ended, with a 410 Expired
//     error event, so that its client resumes or re-lists.
//
// This is etcd's mvcc synced/unsynced watcher split. A synced watcher costs
// no goroutine. The Dispatcher also owns the store and log updates, so that
// a new watcher registers against a state and a log that agree.
type Dispatcher struct {
	store     *Store
	log       *Log
	pres      *Presenter
	versioner storage.Versioner
	newFunc   func() runtime.Object
	clock     clock.Clock
	metrics   *Metrics
	// bookmarkFrequency is how often a watcher that asked for bookmarks gets one.
	bookmarkFrequency time.Duration
	// gate bounds the watchers streaming initial events at once; nil: no bound.
	gate *gate.InitialEvents

	// mu guards the watcher index and lagging, every watcher's state and
	// position, the bookmark schedule and headCh. It also serializes store
	// and log updates with watcher registration. Lock order:
	// dispatcher.mu, then the store's or the history's mutex.
	mu sync.Mutex
	// synced holds the synced watchers, filed so that an event finds only
	// those that may match it.
	synced *watcherIndex
	// lagging holds catching-up watchers.
	lagging map[*Watcher]struct{}
	// bookmarks holds watchers due a bookmark, by Unix second.
	bookmarks map[int64][]*Watcher
	// lastBookmarkSecond is the last second whose bookmarks went out.
	lastBookmarkSecond int64
	// bookmark is the bookmark at bookmarkRV that watchers share.
	bookmark   runtime.Object
	bookmarkRV uint64
	// headCh is closed and replaced whenever the head moves.
	headCh chan struct{}
	// parkBuf is scratch space for fanOutLocked.
	parkBuf []*Watcher
	// delivered counts fanOutLocked's sends to synced watchers for one event.
	delivered int
	// shuttingDown is set by beginShutdown, and closed by Close.
	shuttingDown bool
	closed       bool
	// evictedReported is how many of the log's budget evictions the
	// metrics have counted.
	evictedReported uint64
}

// Config is what a Dispatcher fans out from and to.
type Config struct {
	// Store and Log are the current objects and the history the
	// dispatcher updates for each event, and watchers read.
	Store *Store
	Log   *Log
	// Presenter makes what watchers are sent of an object.
	Presenter *Presenter
	// Versioner sets the resourceVersion of bookmarks and leaving objects.
	Versioner storage.Versioner
	// NewFunc makes the empty object a bookmark carries.
	NewFunc func() runtime.Object
	// Clock times bookmarks and waits.
	Clock clock.Clock
	// BookmarkFrequency is how often a watcher that asked for bookmarks gets one.
	BookmarkFrequency time.Duration
	// Gate bounds the watchers streaming initial events at once; nil: no bound.
	Gate *gate.InitialEvents
	// Metrics are what the dispatcher reports.
	Metrics *Metrics
}

// NewDispatcher returns a dispatcher with no watcher.
func NewDispatcher(cfg Config) *Dispatcher {
	return &Dispatcher{
		store: cfg.Store, log: cfg.Log, pres: cfg.Presenter, versioner: cfg.Versioner, newFunc: cfg.NewFunc,
		clock: cfg.Clock, metrics: cfg.Metrics, gate: cfg.Gate,
		bookmarkFrequency:  cfg.BookmarkFrequency,
		synced:             newWatcherIndex(),
		lagging:            map[*Watcher]struct{}{},
		bookmarks:          map[int64][]*Watcher{},
		lastBookmarkSecond: cfg.Clock.Now().Unix(),
		headCh:             make(chan struct{}),
	}
}

// Close ends every watcher, with no error event, as when the cache stops,
// and refuses those that register after.
func (d *Dispatcher) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	d.endAllLocked(nil)
}

// Process applies one revision's events, in etcd's order, to the store
// and the log at once, and offers each to the synced watchers the index
// finds for it. A watcher whose channel fills inside the revision gets
// nothing more of it here: it is parked at the event it missed, and its
// catch-up sends the rest in order.
func (d *Dispatcher) Process(rev ...*Event) {
	if len(rev) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.store.Apply(rev...)
	_ = inject.Hit(context.Background(), inject.ApplyAppend)
	d.log.Append(rev...)
	// Snapshots live as long as the events after them.
	since, _ := d.log.Bounds()
	d.store.Prune(since)
	for i, e := range rev {
		if inject.On(inject.DropLastOfRevision) && len(rev) > 1 && i == len(rev)-1 {
			continue
		}
		m := d.pres.eventFields(e)
		for _, set := range d.synced.lookup(e) {
			d.fanOutLocked(set.ws, e, m, i)
		}
		d.observeDelivered(e, d.delivered, time.Time{})
		d.delivered = 0
		d.metrics.Dispatched.Inc()
	}
	// Every event before the revision was delivered or filtered out, and
	// its first missed ones.
	before := rev[0].Rev - 1
	for _, w := range d.parkBuf {
		d.parkLocked(w, history.Pos{RV: before, N: w.missed})
		d.metrics.Parked.Inc()
	}
	clear(d.parkBuf)
	d.parkBuf = d.parkBuf[:0]
	d.notifyHeadLocked()
}

// fanOutLocked offers e, the i-th event of its revision, to the synced
// watchers of list it may match.
func (d *Dispatcher) fanOutLocked(list []*Watcher, e *Event, m *eventFields, i int) {
	for _, w := range list {
		if w.missed >= 0 || e.Rev <= w.pos.RV || !w.covers(e.Key) {
			continue
		}
		ev, ok := e.forWatcher(w.filter, d.versioner, d.pres, m)
		if !ok {
			continue
		}
		select {
		case w.ch <- ev:
			w.sent = e.Rev
			d.delivered++
		default:
			w.missed = i
			d.parkBuf = append(d.parkBuf, w)
		}
	}
}

// observeDelivered records the dispatch latency of n deliveries of e, as
// upstream's apiserver_watch_events_dispatch_duration_seconds does: from
// the etcd3 store decoding the event to its watch.Event in a watcher's
// channel ("total"), the part before the cache received it
// ("storage_to_cache"), and the wait for room in the channel
// ("cache_to_watcher"), from built, which is zero for the dispatcher's
// sends, which never wait. The clock is the real one: the decode time is.
// A fan-out's sends are timed together, at its end.
func (d *Dispatcher) observeDelivered(e *Event, n int, built time.Time) {
	if n == 0 || e.Decoded == 0 {
		return
	}
	now := time.Now()
	wait := time.Duration(0)
	if !built.IsZero() {
		wait = now.Sub(built)
	}
	total := time.Duration(now.UnixNano() - e.Decoded)
	toCache := time.Duration(e.Received - e.Decoded)
	for range n {
		d.metrics.Dispatch.ObserveStage(upstream.StageStorageToCache, toCache)
		d.metrics.Dispatch.ObserveStage(upstream.StageCacheToWatcher, wait)
		d.metrics.Dispatch.ObserveStage(upstream.StageTotal, total)
	}
}

// At returns the state at exactly rv, if the store and the history can
// tell it (store.At). Its base is taken under the dispatcher's lock, where
// the history holds every revision the store applied: taken between the
// two (Process), an exact list at rv held the revision after it, which
// the history could not yet undo (issue 65). Upstream updates its store
// and its ring under one lock for the same reason.
func (d *Dispatcher) At(rv uint64) (store.Snapshot, bool) {
	locked := !inject.On(inject.ExactListUnlocked)
	if locked {
		d.mu.Lock()
	}
	b, ok := d.store.Base(rv)
	if locked {
		d.mu.Unlock()
	}
	if !ok {
		return store.Snapshot{}, false
	}
	return d.store.Rebuild(b, d.log.Between)
}

// Progress moves the head to rv on an etcd progress notification.
func (d *Dispatcher) Progress(rv uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.store.Advance(rv)
	d.log.Advance(rv)
	d.notifyHeadLocked()
}

// Compacted drops history that etcd has compacted away, so that the cache
// answers a watch or an exact list from before rev with 410, as the etcd3
// store would. etcd itself still serves a watch from rev-1, without the
// previous values of what changed at rev, which the etcd3 store's watch
// needs: it answers 410, and upstream's conformance
// (RunTestWatchFromZero) expects that. etcd3's compactor keeps at least
// one compaction interval (5 minutes by default) of history, far more than
// the log's window, so in practice this only matters after an explicit
// compaction.
func (d *Dispatcher) Compacted(rev int64) {
	if rev <= 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	since, head := d.log.Bounds()
	// Events up to a compaction the cache has not reached yet still arrive
	// on its established etcd watch; drop only what it already holds.
	upTo := min(uint64(rev), head)
	if upTo <= since {
		return
	}
	d.log.DropUpTo(upTo)
	d.store.Prune(upTo)
}

// Reset ends every watcher and installs a fresh list, as after a relist.
// Ended watchers' clients resume from their last resourceVersion, and get
// 410 if it is older than the new list.
func (d *Dispatcher) Reset(objs []*object.Object, rv uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.endAllLocked(nil)
	d.store.Replace(objs, rv)
	d.log.Reset(rv)
	d.notifyHeadLocked()
}

// PrependHistory puts a backfill's events in front of the log; see
// eventLog.prepend.
func (d *Dispatcher) PrependHistory(events []*Event, from, upTo, generation uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.Prepend(events, from, upTo, generation)
}

// EndAll ends every watcher after the cache lost its etcd watch. Each
// gets a 410 if its channel has room, and its channel closes either way:
// its position can no longer be served, and its client must re-establish.
func (d *Dispatcher) EndAll(reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := apierrors.NewResourceExpired(fmt.Sprintf("%s; the watch cache is re-listing, so list again", reason))
	d.endAllLocked(&watch.Event{Type: watch.Error, Object: &err.ErrStatus})
}

// endAllLocked closes every watcher's channel, or has its catch-up
// goroutine close it. With errEv, synced watchers with room get it first.
func (d *Dispatcher) endAllLocked(errEv *watch.Event) {
	ended := 0
	defer func() { d.metrics.Terminated.Add(float64(ended)) }()
	endSynced := func(w *Watcher) {
		ended++
		w.end()
		w.state = stopped
		if errEv != nil {
			select {
			case w.ch <- *errEv:
			default:
			}
		}
		close(w.ch)
	}
	d.synced.each(endSynced)
	for w := range d.lagging {
		ended++
		w.end()
	}
	d.synced = newWatcherIndex()
}

// RecordGauges updates the watcher and memory gauges.
func (d *Dispatcher) RecordGauges() {
	d.mu.Lock()
	synced := d.synced.len()
	lagging := len(d.lagging)
	bytes, evicted := d.log.Usage()
	newlyEvicted := evicted - d.evictedReported
	d.evictedReported = evicted
	d.mu.Unlock()
	d.metrics.HistoryBytes.Set(float64(bytes))
	d.metrics.Evicted.Add(float64(newlyEvicted))
	snapshots := d.store.Counts().Snapshots
	d.metrics.Synced.Set(float64(synced))
	d.metrics.Lagging.Set(float64(lagging))
	d.metrics.Snapshots.Set(float64(snapshots))
	d.metrics.History.Set(float64(d.log.Len()))
	d.metrics.Capacity.Set(float64(d.log.Capacity()))
}
