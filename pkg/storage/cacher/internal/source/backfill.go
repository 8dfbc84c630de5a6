package source

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// A warm start fills the event log from etcd's retained history instead of
// leaving it empty, so that a client coming back to a restarted server with
// a resourceVersion from before the restart gets the events after it, not
// a 410 and a re-list.
//
// The cache starts as a cold one does: it lists the current state, at
// revision to, and becomes ready. Behind it a backfill lists the state at an
// older revision from, replays etcd's history from there to to, and puts the
// events in front of the log. A watch from a resourceVersion between from
// and to that arrives meanwhile waits for it, up to FreshnessTimeout. etcd
// paces a watch that catches up on history at about 1,000 revisions a
// tenth of a second, so making readiness wait for the replay would make a
// warm start ten times slower than a cold one (BenchmarkStart).
//
// How far back: WarmStartRevisions before to, or etcd's compaction if that
// is later. etcd's compactor keeps five minutes by default, so at moderate
// write rates the revision bound is what applies.

// A backfill that fails for a reason that passes (etcd paused or without
// a leader, its watch silent or closed, a list that timed out) tries
// again, with a backoff, for as long as the log it fills still starts
// where it did: giving up turned a warm start cold for good when etcd was
// slow during a restart (issue 65). It stops when it is filled, when the
// log moved on (a re-list, or events trimmed from its front), when etcd's
// compaction overtook it backfillAttempts times, when what it read does
// not decode (no attempt would read it otherwise), or when the cache stops
// or lists again.

// backfill is history being filled in behind the log.
type backfill struct {
	// to is the revision the log starts at; the backfill covers what is before it.
	to uint64
	// generation is the log's, which the backfill fills unless it was
	// reset or trimmed since.
	generation uint64
	// from is the oldest revision the backfill promises: the bound it
	// starts with, then the revision it fills from once etcd told it.
	from atomic.Uint64
	// done is closed when the backfill has finished, filled or not.
	done chan struct{}
	// abandoned is set, before done closes, when the backfill ended with
	// its context: the cache stopped or lists again.
	abandoned atomic.Bool
}

// ended reports whether the backfill has finished.
func (bf *backfill) ended() bool {
	select {
	case <-bf.done:
		return true
	default:
		return false
	}
}

// errBackfilled ends the backfill's watch once it has reached its end.
var errBackfilled = errors.New("backfilled")

// errMovedOn is a backfill's when the log it was to fill was reset or
// trimmed meanwhile: no attempt can fill it.
var errMovedOn = errors.New("the log moved on during the backfill")

// backfillAttempts bounds the attempts of a backfill that etcd's
// compaction overtook between finding the oldest revision it serves and
// replaying from there: each finds a newer one.
const backfillAttempts = 3

// Delays between a backfill's attempts after a failure that passes: short
// at first, as most are a moment's, and at most a second and a half, so
// that the backfill fills within two seconds of etcd answering again.
const (
	minBackfillRetry = 100 * time.Millisecond
	maxBackfillRetry = 1500 * time.Millisecond
)

// Results of a backfill, the result label of its counter.
const (
	BackfillStarted   = "started"
	BackfillFilled    = "filled"
	BackfillRetried   = "retried"
	BackfillGaveUp    = "given_up"
	BackfillAbandoned = "abandoned"
)

// startBackfill fills the history before to, where the log now starts,
// unless the log is reset or ctx ends first.
func (s *Source) startBackfill(ctx context.Context, to uint64) {
	if s.cfg.WarmStartRevisions <= 0 {
		s.backfill.Store(nil)
		return
	}
	bf := &backfill{to: to, generation: s.cfg.History.Resets(), done: make(chan struct{})}
	bf.from.Store(uint64(max(int64(to)-s.cfg.WarmStartRevisions, s.cfg.Store.CompactRevision(), 1)))
	s.backfill.Store(bf)
	s.cfg.Metrics.Backfill(BackfillStarted)
	go func() {
		defer close(bf.done)
		err := s.fillRetrying(ctx, bf)
		switch {
		case ctx.Err() != nil:
			bf.abandoned.Store(true)
			s.cfg.Metrics.Backfill(BackfillAbandoned)
		case err != nil:
			s.cfg.Metrics.Backfill(BackfillGaveUp)
			klog.ErrorS(err, "Watch cache could not fill its history from etcd", "resource", s.cfg.GroupResource)
		default:
			s.cfg.Metrics.Backfill(BackfillFilled)
		}
	}()
}

// fillRetrying fills the history before bf.to, trying again after every
// failure but those no attempt can get past.
func (s *Source) fillRetrying(ctx context.Context, bf *backfill) error {
	delay, overtaken := minBackfillRetry, 0
	for {
		err := s.fill(ctx, bf)
		switch {
		case err == nil || ctx.Err() != nil || errors.Is(err, errMovedOn) || unreadable(err):
			return err
		case errors.Is(err, errOvertaken):
			if overtaken++; overtaken == backfillAttempts {
				return err
			}
			continue
		case inject.On(inject.BackfillGivesUp):
			return err
		}
		s.cfg.Metrics.Backfill(BackfillRetried)
		klog.InfoS("Watch cache's backfill failed; trying again", "resource", s.cfg.GroupResource, "to", bf.to,
			"retryIn", delay, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.cfg.Clock.After(delay):
		}
		delay = min(2*delay, maxBackfillRetry)
	}
}

// errOvertaken is a backfill's when etcd compacted past where it began.
var errOvertaken = errors.New("etcd compacted past the start of the backfill")

// unreadable reports whether err is what a backfill read and could not
// decode: no attempt would read it otherwise.
func unreadable(err error) bool {
	var end End
	return errors.Is(err, errUnreadable) || (errors.As(err, &end) && end.Reason == EndUnreadable)
}

// fill fills the history before bf.to once, from the oldest revision etcd
// serves within WarmStartRevisions.
func (s *Source) fill(ctx context.Context, bf *backfill) error {
	if !s.cfg.History.Fillable(bf.generation) {
		return errMovedOn
	}
	to := bf.to
	from, err := s.warmStartFrom(ctx, to)
	if err != nil || from == 0 {
		return err
	}
	bf.from.Store(from)
	// held is what the events gauge has of this attempt's.
	held := 0
	hold := func(n int) {
		s.cfg.Metrics.BackfillEvents.Add(float64(n - held))
		held = n
	}
	defer hold(0)
	// What the backfill cannot hold it does not promise: a watch from
	// below what it kept gets 410 at once, not a wait and then a 410.
	fillable := func() bool { return s.cfg.History.Fillable(bf.generation) }
	events, from, err := s.replay(ctx, from, to, fillable, hold, func(from uint64) { bf.from.Store(from) })
	if err != nil {
		return err
	}
	if err := inject.Hit(ctx, inject.BackfillPrepend); err != nil {
		return err
	}
	if !s.cfg.Sink.PrependHistory(events, from, to, bf.generation) {
		return errMovedOn
	}
	klog.V(2).InfoS("Watch cache filled its history from etcd", "resource", s.cfg.GroupResource,
		"from", from, "to", to, "events", len(events))
	return nil
}

// errFilling is what a watch that waited for a backfill gets when the
// backfill did not end in time, or the cache abandoned it: 429, as while
// the cache is initializing. The history may lack what the watch needs
// though etcd still has it, and a 410 would make the client re-list; its
// retry finds the history filled, or the cache that replaced this one
// serving. A backfill the cache abandoned is never waited for again: the
// list after it starts another, or, cold, none (Run), and a watch below a
// cold list gets 410.
func (s *Source) errFilling(why string) error {
	return apierrors.NewTooManyRequests(fmt.Sprintf("the watch cache for %s is %s; retry shortly", s.cfg.GroupResource, why), 1)
}

// WaitForBackfill waits, up to FreshnessTimeout, for a backfill that may
// cover rv, so that a client resuming from rv right after a start gets
// the events after it rather than a 410. If the backfill has not ended
// by then, or the cache abandoned it, as it does when it stops or lists
// again, the watch is told to retry.
func (s *Source) WaitForBackfill(ctx context.Context, rv uint64) error {
	bf := s.backfill.Load()
	// Below where the backfill fills from, nothing it fills serves rv:
	// the dispatcher answers 410 at once. from only rises.
	if bf == nil || rv >= bf.to || rv < bf.from.Load() {
		return nil
	}
	timer := s.cfg.Clock.NewTimer(s.cfg.FreshnessTimeout)
	defer timer.Stop()
	select {
	case <-bf.done:
		if bf.abandoned.Load() {
			return s.errFilling("restarting")
		}
	case <-timer.C():
		return s.errFilling("still filling its history from etcd")
	case <-ctx.Done():
	}
	return nil
}

// Promised is the oldest resourceVersion the cache promises to serve a
// watch from, as far as its own history goes: where its log is complete
// from, or, while a backfill that can still fill it runs, where the
// backfill fills from. etcd's compaction bounds it too (Cacher.Floor).
// While a backfill runs it is a promise, not a certainty: a budget that
// cannot hold all of the backfill, or a compaction etcd made on its own
// that the store has not seen, raises where the log ends up complete from.
func (s *Source) Promised() uint64 {
	since, _ := s.cfg.History.Bounds()
	if bf := s.backfill.Load(); bf != nil && !bf.ended() && s.cfg.History.Fillable(bf.generation) {
		return min(since, bf.from.Load())
	}
	return since
}

// backfillProgressRetry is how often a backfill's watch asks etcd for
// progress until it reaches its end. etcd defers a progress request made
// while a watch catches up on history, and answers it only with the
// stream's next event: on a resource with no event in the backfill's range
// there is none, and a backfill of an idle resource waited for the silence
// check's request, seconds later, while watches from before its start got
// 410 (TestRobustness, the mixed profile).
const backfillProgressRetry = 100 * time.Millisecond

// Backfilled returns a channel closed once the latest warm start's backfill
// has ended, filled or not, or nil if there was none.
func (s *Source) Backfilled() <-chan struct{} {
	if bf := s.backfill.Load(); bf != nil {
		return bf.done
	}
	return nil
}

// replay builds the events from from to to: the state at from, then every
// revision after it up to to, each event with the object it replaced,
// while fillable says the log still takes them. It
// holds the newest revisions within BackfillEvents and BackfillBytes, and
// returns them with the revision they follow, which raise is told of as it
// rises. It tells hold how many events it holds as it goes.
func (s *Source) replay(ctx context.Context, from, to uint64, fillable func() bool, hold func(events int),
	raise func(from uint64)) ([]*fanout.Event, uint64, error) {
	objs, _, err := s.listAt(ctx, from, true)
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return nil, 0, fmt.Errorf("listing at %d: %w", from, errOvertaken)
	}
	if err != nil {
		return nil, 0, err
	}
	kept := replayed{maxEvents: s.cfg.BackfillEvents, maxBytes: s.cfg.BackfillBytes, from: from}
	state := make(map[string]*object.Object, len(objs))
	for _, o := range objs {
		state[o.Key] = o
	}
	now := s.cfg.Clock.Now().UnixNano()
	// last is the newest revision replayed: etcd's client can deliver a
	// revision again (etcd-io/etcd#20221), and one applied twice would be
	// out of order in the log, which After, Between and At search.
	last := from
	apply := func(ch Change) error {
		if ch.Rev <= last && !inject.On(inject.ReplayKeepsRepeats) {
			return nil
		}
		prev := state[ch.Key]
		if ch.Deleted && prev == nil {
			return nil
		}
		o := ch.Held
		if o == nil && ch.Object != nil {
			o = s.held(ch.Object)
		}
		if o == nil {
			var err error
			if o, err = s.object(ch, prev); err != nil {
				return err
			}
		}
		e := &fanout.Event{Key: eventKey(ch, o), Rev: ch.Rev, Cur: o, Prev: prev, Seen: now}
		switch {
		case ch.Deleted:
			e.Type = watch.Deleted
			delete(state, ch.Key)
		case prev == nil:
			e.Type = watch.Added
			state[ch.Key] = o
		default:
			e.Type = watch.Modified
			state[ch.Key] = o
		}
		kept.add(e)
		return nil
	}
	handle := func(r Response) (End, bool) {
		if r.End != nil {
			return *r.End, true
		}
		// A revision etcd repeats comes whole, in the response it came in:
		// last moves only past a revision once all of it is applied.
		err := revisions(r.Changes, func(rev []Change) error {
			if rev[0].Rev > to {
				return errBackfilled
			}
			for _, ch := range rev {
				if err := apply(ch); err != nil {
					return err
				}
			}
			last = max(last, rev[0].Rev)
			if kept.trim() {
				raise(kept.from)
			}
			return nil
		})
		hold(kept.len())
		switch {
		case errors.Is(err, errBackfilled):
			return End{Err: errBackfilled}, true
		case err != nil:
			return End{Reason: EndUnreadable, Err: err}, true
		}
		// A response holds whole revisions: to's are all in once one is.
		if last >= to || r.Progress >= to {
			return End{Err: errBackfilled}, true
		}
		return End{}, false
	}
	asked := make(chan struct{}, 1)
	ticker := s.cfg.Clock.NewTicker(backfillProgressRetry)
	defer ticker.Stop()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-ticker.C():
				select {
				case asked <- struct{}{}:
				default:
				}
			}
		}
	}()
	// The replay's watch is idle only once it holds what etcd holds: its
	// own position, not the cache's head, which is past every revision it
	// replays. Judged by the head, a replay that etcd stopped answering
	// looked idle on an idle etcd, and never ended.
	position := func() uint64 { return last }
	if inject.On(inject.BackfillIdleByHead) {
		position = s.f.head
	}
	// A watch that ends for a reason that passes is opened again after
	// the last revision replayed, with what it replayed kept: starting
	// over listed the state at from again and replayed it all, and on a
	// starved machine (20,000 streams on two cores) a replay judged silent
	// every few seconds never got to its end.
	delay := minBackfillRetry
	for {
		resumedAt := last
		end := s.f.watch(ctx, last, nil, asked, handle, func() {}, position, true)
		switch {
		case errors.Is(end.Err, errBackfilled):
			return kept.events(), kept.from, nil
		case end.Reason == EndCompacted:
			return nil, 0, fmt.Errorf("replaying etcd's history from %d to %d: %w", from, to, errOvertaken)
		case !fillable():
			return nil, 0, errMovedOn
		case ctx.Err() != nil || unreadable(end) || inject.On(inject.BackfillGivesUp):
			return nil, 0, fmt.Errorf("replaying etcd's history from %d to %d: %w", from, to, end)
		}
		if last > resumedAt {
			delay = minBackfillRetry // it got somewhere: the end was a moment's
		}
		s.cfg.Metrics.Backfill(BackfillRetried)
		klog.InfoS("Watch cache's backfill lost its etcd watch; resuming", "resource", s.cfg.GroupResource,
			"after", last, "to", to, "retryIn", delay, "err", end)
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-s.cfg.Clock.After(delay):
		}
		delay = min(2*delay, maxBackfillRetry)
	}
}

// replayed is what a replay holds: the newest whole revisions within
// maxEvents and maxBytes (0 is no bound), counted as the log counts them,
// which would drop the older ones anyway (history.Log.Prepend). Holding
// them all held every event of a backfill, at a million objects written 128
// to a revision all the objects' events, while the log took 100,000.
type replayed struct {
	maxEvents int
	maxBytes  int64
	// held are the events, the oldest dropped ones before start.
	held  []*fanout.Event
	start int
	bytes int64
	// from is the revision the events follow: the replay's start, then
	// the last revision dropped.
	from uint64
}

func (r *replayed) add(e *fanout.Event) {
	r.held = append(r.held, e)
	r.bytes += e.Size()
}

func (r *replayed) len() int { return len(r.held) - r.start }

// trim drops the oldest whole revisions beyond the bounds, and reports
// whether it dropped any. Call it between revisions.
func (r *replayed) trim() bool {
	dropped := false
	for r.len() > 0 && ((r.maxEvents > 0 && r.len() > r.maxEvents) || (r.maxBytes > 0 && r.bytes > r.maxBytes)) {
		rev := r.held[r.start].Rev
		for r.start < len(r.held) && r.held[r.start].Rev == rev {
			r.bytes -= r.held[r.start].Size()
			r.held[r.start] = nil
			r.start++
		}
		r.from, dropped = rev, true
	}
	// Keep the dropped slots from pinning the array's growth.
	if r.start > len(r.held)/2 {
		r.held = append([]*fanout.Event(nil), r.held[r.start:]...)
		r.start = 0
	}
	return dropped
}

// events returns the events held, oldest first.
func (r *replayed) events() []*fanout.Event { return r.held[r.start:] }

// warmStartFrom returns the revision a backfill up to to starts from, or
// 0 when there is nothing to fill.
func (s *Source) warmStartFrom(ctx context.Context, to uint64) (uint64, error) {
	lo := max(int64(to)-s.cfg.WarmStartRevisions, s.cfg.Store.CompactRevision(), 1)
	if uint64(lo) >= to {
		return 0, nil
	}
	// etcd may have been compacted past what the store has seen (etcd's
	// own auto-compaction records nothing): find the oldest revision it
	// still serves. Probes are single-item lists, at most log2(bound).
	ok, err := s.readableAt(ctx, uint64(lo))
	if err != nil || ok {
		return uint64(lo), err
	}
	hi := int64(to) // readable
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok, err = s.readableAt(ctx, uint64(mid)); err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	if uint64(hi) >= to {
		return 0, nil
	}
	klog.V(2).InfoS("Warm start bounded by etcd's compaction", "resource", s.cfg.GroupResource, "from", hi)
	return uint64(hi), nil
}

// readableAt reports whether etcd still serves the state at rev.
func (s *Source) readableAt(ctx context.Context, rev uint64) (bool, error) {
	err := s.cfg.Store.GetList(ctx, s.cfg.ResourcePrefix, storage.ListOptions{
		ResourceVersion:      strconv.FormatUint(rev, 10),
		ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		Recursive:            true,
		Predicate:            storage.SelectionPredicate{Label: labels.Everything(), Field: fields.Everything(), Limit: 1},
	}, s.cfg.NewListFunc())
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		return false, nil
	default:
		return false, err
	}
}
