package source

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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
}

// errBackfilled ends the backfill's watch once it has reached its end.
var errBackfilled = errors.New("backfilled")

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
		from, err := s.warmStartFrom(ctx, to)
		if err != nil || from == 0 {
			if err != nil && ctx.Err() == nil {
				klog.ErrorS(err, "Watch cache could not fill its history from etcd", "resource", s.cfg.GroupResource)
			}
			return
		}
		events, err := s.replay(ctx, from, to)
		if err == nil && !s.cfg.Sink.PrependHistory(events, from, to, generation) {
			err = fmt.Errorf("the log moved on during the backfill")
		}
		if err != nil {
			if ctx.Err() == nil {
				klog.ErrorS(err, "Watch cache could not fill its history from etcd", "resource", s.cfg.GroupResource)
			}
			return
		}
		klog.V(2).InfoS("Watch cache filled its history from etcd", "resource", s.cfg.GroupResource,
			"from", from, "to", to, "events", len(events))
	}()
}

// WaitForBackfill waits, up to FreshnessTimeout, for a backfill that may
// cover rv, so that a client resuming from rv right after a start gets
// the events after it rather than a 410.
func (s *Source) WaitForBackfill(ctx context.Context, rv uint64) {
	bf := s.backfill.Load()
	if bf == nil || rv >= bf.to {
		return
	}
	timer := s.cfg.Clock.NewTimer(s.cfg.FreshnessTimeout)
	defer timer.Stop()
	select {
	case <-bf.done:
	case <-timer.C():
	case <-ctx.Done():
	}
}

// Backfilled returns a channel closed once the latest warm start's backfill
// has ended, filled or not, or nil if there was none.
func (s *Source) Backfilled() <-chan struct{} {
	if bf := s.backfill.Load(); bf != nil {
		return bf.done
	}
	return nil
}

// replay builds the events from from to to: the state at from, then every
// change after it, each with the object it replaced.
func (s *Source) replay(ctx context.Context, from, to uint64) ([]*fanout.Event, error) {
	objs, _, err := s.listAt(ctx, from, true)
	if err != nil {
		return nil, err
	}
	state := make(map[string]*object.Object, len(objs))
	for _, o := range objs {
		state[o.Key] = o
	}
	var events []*fanout.Event
	now := s.cfg.Clock.Now().UnixNano()
	handle := func(ev watch.Event) (End, bool) {
		ev, _ = UnwrapRecordTime(ev)
		switch ev.Type {
		case watch.Bookmark:
			if rv, err := s.cfg.Versioner.ObjectResourceVersion(ev.Object); err != nil || rv >= to {
				return End{Err: errBackfilled}, true
			}
		case watch.Added, watch.Modified, watch.Deleted:
			o := s.held(ev.Object)
			if o == nil {
				var err error
				if o, err = s.cfg.Build.Build(ev.Object); err != nil {
					return End{Reason: EndUnreadable, Err: err}, true
				}
			}
			if o.RV > to {
				return End{Err: errBackfilled}, true
			}
			prev := state[o.Key]
			e := &fanout.Event{Key: o.Key, Rev: o.RV, Cur: o, Prev: prev, Seen: now}
			switch {
			case ev.Type == watch.Deleted && prev == nil:
				e = nil
			case ev.Type == watch.Deleted:
				e.Type = watch.Deleted
				delete(state, o.Key)
			case prev == nil:
				e.Type = watch.Added
				state[o.Key] = o
			default:
				e.Type = watch.Modified
				state[o.Key] = o
			}
			if e != nil {
				events = append(events, e)
			}
			if o.RV == to {
				return End{Err: errBackfilled}, true
			}
		case watch.Error:
			return Classify(apierrors.FromObject(ev.Object)), true
		}
		return End{}, false
	}
	end := s.f.watch(ctx, from, nil, nil, handle, func() {})
	if !errors.Is(end.Err, errBackfilled) {
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
