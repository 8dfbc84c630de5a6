package source

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// Retry delays after a failed list.
const (
	minRetryDelay = 100 * time.Millisecond
	maxRetryDelay = 5 * time.Second
)

// Store is what the source needs of the etcd3 store.
type Store interface {
	GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error
	GetCurrentResourceVersion(ctx context.Context) (uint64, error)
	CompactRevision() int64
}

// Sink takes what the source reads: the fan-out's dispatcher, which
// applies it to the store and the history and tells the watchers.
type Sink interface {
	// Reset replaces the state with a list's, ending every watcher.
	Reset(objs []*object.Object, rv uint64)
	// Process applies one revision's events, all at once.
	Process(rev ...*fanout.Event)
	// Progress moves the head to rv with no change.
	Progress(rv uint64)
	// PrependHistory puts a backfill's events before the history, unless
	// it was reset since generation.
	PrependHistory(events []*fanout.Event, from, upTo, generation uint64) bool
	// EndAll ends every watcher, saying why.
	EndAll(reason string)
}

// Objects is the state the sink keeps: the store.
type Objects interface {
	Get(key string) (*object.Object, bool)
	Latest() store.Snapshot
}

// History is the sink's history of events.
type History interface {
	// Bounds' head is the newest resourceVersion the cache holds.
	Bounds() (since, head uint64)
	// Resets counts the history's resets: a backfill's generation.
	Resets() uint64
	// Fillable reports whether a backfill of generation could still fill
	// the history: it was neither reset nor trimmed since.
	Fillable(generation uint64) bool
}

// Config is what a Source reads, what it feeds, and how.
type Config struct {
	// Store is read under ResourcePrefix, for GroupResource.
	Store Store
	// Changes is etcd's record of the resource's changes, which the
	// source follows after each list.
	Changes        Changes
	ResourcePrefix string
	GroupResource  schema.GroupResource
	NewListFunc    func() runtime.Object
	Versioner      storage.Versioner
	// Build makes the cache's object versions from the store's objects.
	Build *object.Builder
	// Keys, if set, reads the resource's keys without values: lists are
	// then read in pages at once, and the consistency check runs.
	Keys KeyReader
	// Ranges, if set with Keys, reads the pages of a list after the first
	// (listSplit), each over its own keys only; without it they are read
	// through Store, each to the end of the resource, at a cost to etcd
	// that grows as the square of the objects (streamRange).
	Ranges RangeReader
	// ListPageSize bounds the pages of the source's lists, and
	// ListPageBytes the bytes of the objects in each page after the first
	// (split.go).
	ListPageSize, ListPageBytes int64
	// WarmStartRevisions is how far back a warm start fills the history;
	// 0 or less does not (backfill.go).
	WarmStartRevisions int64
	// BackfillEvents and BackfillBytes bound what a backfill holds, as
	// they bound the log it fills (its MaxSize and Budget); 0 is no bound.
	// Beyond them it keeps the newest revisions and promises no older one.
	BackfillEvents int
	BackfillBytes  int64
	// ConsistencyCheckInterval is how often the cache is compared with
	// etcd, if Keys is set; 0 or less never.
	ConsistencyCheckInterval time.Duration
	// FreshnessTimeout bounds a watch's wait for a backfill.
	FreshnessTimeout time.Duration
	// ProgressRequestInterval is how long a watch may hear nothing before
	// it is asked for progress (silence.go).
	ProgressRequestInterval time.Duration
	// Connections, if set, closes the connections to etcd gone as quiet as
	// a silent watch, so that the next watch reaches a member that answers.
	Connections ConnectionDropper
	Clock       clock.WithTicker

	// Sink, Objects and History are the cache the source fills.
	Sink    Sink
	Objects Objects
	History History
	// Ready is the cache's readiness, which the source sets.
	Ready   *Readiness
	Metrics Metrics
}

// Metrics is what the source reports, under its resource's labels. The
// cache makes and registers them.
type Metrics struct {
	// Received counts the events from etcd, Replayed those dropped as
	// repeats, Listed and ListFailed the lists.
	Received, Replayed, Listed, ListFailed compbasemetrics.CounterMetric
	// PageRetried counts the pages of lists read again at their list's
	// revision, the rest of the list kept (retryPage).
	PageRetried compbasemetrics.CounterMetric
	// ListDuration observes the lists, and Gap each time without a
	// working watch, in seconds.
	ListDuration, Gap compbasemetrics.ObserverMetric
	// Restarted counts watches re-opened without a re-list and Relisted
	// re-lists, by End reason; Checked counts consistency checks by result.
	Restarted, Relisted, Checked func(string)
	// ResourceVersion records each event's resourceVersion.
	ResourceVersion func(uint64)
	// Backfill counts warm starts' backfills by result (Backfill*), and
	// BackfillEvents is the events running backfills hold, not yet in the
	// log: each adds what it holds, and takes it away as it ends.
	Backfill       func(string)
	BackfillEvents interface{ Add(float64) }
}

// Source fills a cache from etcd: it lists, then follows etcd's changes,
// and lists again only when it must.
type Source struct {
	cfg Config
	f   *follower
	// relist carries the consistency check's request to list again.
	relist chan string
	// backfill is the latest warm start's history fill, if any.
	backfill atomic.Pointer[backfill]
	// lastEvent is the resourceVersion of the newest event the watch
	// delivered, or of the list it follows from. Only Run's goroutine
	// uses it: see ingest's check of etcd's order.
	lastEvent uint64
}

// New returns a Source for cfg; Run starts it.
func New(cfg Config) *Source {
	s := &Source{cfg: cfg, relist: make(chan string, 1)}
	s.f = newFollower(cfg, s.head)
	return s
}

// head is the newest resourceVersion the cache holds.
func (s *Source) head() uint64 {
	_, head := s.cfg.History.Bounds()
	return head
}

// Run lists, then follows etcd until ctx ends, and checks the cache's
// consistency meanwhile. It lists again only when following cannot go on
// without losing events: see follower. The first list, and a re-list after
// compaction, start warm: see backfill.go.
func (s *Source) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	if s.cfg.Keys != nil && s.cfg.ConsistencyCheckInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.checkLoop(ctx)
		}()
	}
	m, gr := s.cfg.Metrics, s.cfg.GroupResource
	delay := minRetryDelay
	warm := true
	for ctx.Err() == nil {
		start := s.cfg.Clock.Now()
		rv, err := s.list(ctx)
		var end End
		if err != nil {
			m.ListFailed.Inc()
			klog.InfoS("Watch cache could not list etcd; trying again", "resource", gr, "retryIn", delay, "err", err)
		} else {
			m.Listed.Inc()
			m.ListDuration.Observe(s.cfg.Clock.Since(start).Seconds())
			delay = minRetryDelay
			listCtx, cancel := context.WithCancel(ctx)
			// The backfill is known before the cache is ready: a watch
			// resuming from before the list as soon as it is ready waits
			// for the history it fills, not a 410. After a cold list there
			// is none to wait for, and a backfill an earlier list started
			// and this one abandoned is not waited for: a watch from before
			// the list gets 410 at once, where it got 429 until the next
			// warm start.
			if warm {
				s.startBackfill(listCtx, rv)
			} else if !inject.On(inject.BackfillKept) {
				s.backfill.Store(nil)
			}
			s.cfg.Ready.Set(Ready)
			s.lastEvent = rv
			if err := inject.Hit(listCtx, inject.ListToWatch); err != nil {
				klog.InfoS("Failpoint before the watch", "resource", gr, "err", err)
			}
			end = s.f.follow(listCtx, rv, s.relist, s.handle)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		s.cfg.Ready.Set(Pending)
		if err == nil {
			m.Relisted(end.Reason)
			s.cfg.Sink.EndAll(fmt.Sprintf("the watch cache for %s must list again (%v)", gr, end))
			klog.InfoS("Watch cache is re-listing", "resource", gr, "reason", end.Reason, "err", end.Err)
			// After a compaction the history since it is sound; after an
			// unreadable event or a failed check it may hold the cause. A
			// failed list decides nothing: the list after it is as warm as
			// the one that failed was to be, where it was cold (issue 65).
			warm = end.Reason == EndCompacted
		} else if inject.On(inject.FailedListCold) {
			warm = false
		}
		select {
		case <-ctx.Done():
			return
		case <-s.cfg.Clock.After(delay):
		}
		delay = min(2*delay, maxRetryDelay)
		if err := inject.Hit(ctx, inject.Relist); err != nil {
			klog.InfoS("Failpoint before the list", "resource", gr, "err", err)
		}
	}
}

// list reads every object at the current revision and hands them to the
// sink, which ends every open watcher: events between its position and
// the list are unknown.
func (s *Source) list(ctx context.Context) (uint64, error) {
	// This list answers any re-list the consistency check asked for.
	select {
	case <-s.relist:
	default:
	}
	objs, rv, err := s.listAt(ctx, 0, false)
	if err != nil {
		return 0, err
	}
	s.cfg.Sink.Reset(objs, rv)
	return rv, nil
}

// requestRelist makes the cache list again, ending its watchers, as when
// the consistency check finds it wrong. It does not wait.
func (s *Source) requestRelist(reason string) {
	select {
	case s.relist <- reason:
	default: // One is already pending.
	}
}

// Answered notes that etcd answered a request, when err is nil, so that a
// re-watch waiting for etcd to recover need not wait out its delay. It
// returns err.
func (s *Source) Answered(err error) error { return s.f.answer(err) }

// RequestProgress has the cache's etcd watch ask etcd for a progress
// notification, on the watch's own stream. It does not wait: requests made
// while one is pending are one request.
func (s *Source) RequestProgress() { s.f.askProgress() }
