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

// backfill is history being filled in behind the log.
type backfill struct {
	// to is the revision the log starts at; the backfill covers what is before it.
	to uint64
	// done is closed when the backfill has finished, filled or not.
	done chan struct{}
	// abandoned is set, before done closes, when the backfill ended with
	// its context: the cache stopped or lists again.
	abandoned atomic.Bool
}

// errBackfilled ends the backfill's watch once it has reached its end.
var errBackfilled = errors.New("backfilled")

// backfillAttempts bounds the attempts of a backfill that etcd's
// compaction overtook between finding the oldest revision it serves and
// replaying from there: each finds a newer one.
const backfillAttempts = 3

// startBackfill fills the history before to, where the log now starts,
// unless the log is reset or ctx ends first.
func (s *Source) startBackfill(ctx context.Context, to uint64) {
	if s.cfg.WarmStartRevisions <= 0 {
		return
	}
	bf := &backfill{to: to, done: make(chan struct{})}
	generation := s.cfg.History.Resets()
	s.backfill.Store(bf)
	go func() {
		defer close(bf.done)
		var err error
		for range backfillAttempts {
			if err = s.fill(ctx, to, generation); !errors.Is(err, errOvertaken) {
				break
			}
		}
		switch {
		case ctx.Err() != nil:
			bf.abandoned.Store(true)
		case err != nil:
			klog.ErrorS(err, "Watch cache could not fill its history from etcd", "resource", s.cfg.GroupResource)
		}
	}()
}

// errOvertaken is a backfill's when etcd compacted past where it began.
var errOvertaken = errors.New("etcd compacted past the start of the backfill")

// fill fills the history before to once, from the oldest revision etcd
// serves within WarmStartRevisions.
func (s *Source) fill(ctx context.Context, to, generation uint64) error {
	from, err := s.warmStartFrom(ctx, to)
	if err != nil || from == 0 {
		return err
	}
	events, err := s.replay(ctx, from, to)
	if err != nil {
		return err
	}
	if !s.cfg.Sink.PrependHistory(events, from, to, generation) {
		return fmt.Errorf("the log moved on during the backfill")
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
// serving.
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
	if bf == nil || rv >= bf.to {
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
// revision after it up to to, each event with the object it replaced.
func (s *Source) replay(ctx context.Context, from, to uint64) ([]*fanout.Event, error) {
	objs, _, err := s.listAt(ctx, from, true)
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return nil, fmt.Errorf("listing at %d: %w", from, errOvertaken)
	}
	if err != nil {
		return nil, err
	}
	state := make(map[string]*object.Object, len(objs))
	for _, o := range objs {
		state[o.Key] = o
	}
	var events []*fanout.Event
	now := s.cfg.Clock.Now().UnixNano()
	apply := func(ch Change) error {
		prev := state[ch.Key]
		if ch.Deleted && prev == nil {
			return nil
		}
		var o *object.Object
		if ch.Object != nil {
			o = s.held(ch.Object)
		}
		if o == nil {
			var err error
			if o, err = s.object(ch, prev); err != nil {
				return err
			}
		}
		e := &fanout.Event{Key: ch.Key, Rev: ch.Rev, Cur: o, Prev: prev, Seen: now}
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
		events = append(events, e)
		return nil
	}
	handle := func(r Response) (End, bool) {
		if r.End != nil {
			return *r.End, true
		}
		for _, ch := range r.Changes {
			if ch.Rev > to {
				return End{Err: errBackfilled}, true
			}
			if err := apply(ch); err != nil {
				return End{Reason: EndUnreadable, Err: err}, true
			}
		}
		// A response holds whole revisions: to's are all in once one is.
		if n := len(r.Changes); (n > 0 && r.Changes[n-1].Rev >= to) || r.Progress >= to {
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
	end := s.f.watch(ctx, from, nil, asked, handle, func() {})
	switch {
	case end.Reason == EndCompacted:
		return nil, fmt.Errorf("replaying etcd's history from %d to %d: %w", from, to, errOvertaken)
	case !errors.Is(end.Err, errBackfilled):
		return nil, fmt.Errorf("replaying etcd's history from %d to %d: %w", from, to, end)
	}
	return events, nil
}

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
