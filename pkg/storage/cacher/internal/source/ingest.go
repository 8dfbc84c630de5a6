package source

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// handle applies one etcd watch response: its revisions, each whole, then
// its progress. stop is true when the response ends the watch.
func (s *Source) handle(r Response) (end End, stop bool) {
	if r.End != nil {
		return *r.End, true
	}
	err := revisions(r.Changes, func(rev []Change) error { return s.ingest(rev, r.Decoded) })
	if err != nil {
		return End{Reason: EndUnreadable, Relist: true, Err: err}, true
	}
	if r.Progress > 0 {
		s.cfg.Sink.Progress(r.Progress)
	}
	return End{}, false
}

// ingest turns one revision's changes into cached events and hands them
// to the sink at once, so that nothing the cache serves holds part of the
// revision. decoded is when they were decoded, if known.
//
// A revision at or before the newest one the cache applied is a repeat,
// and is dropped whole. etcd sends a watch's events in revision order, but
// a watch its client resumed on another member can start below the
// revision the cache asked for and repeat events (etcd-io/etcd#20221: the
// client takes its resume revision from a progress notification of a
// member that is behind). Applied again, such an event would put an old
// version back in the store under a newer resourceVersion. The head is not
// the mark: progress notifications move it too, and an event at or below a
// head a notification set was dropped, silently, by the check this
// replaces (issue 56).
func (s *Source) ingest(rev []Change, decoded time.Time) error {
	rv := rev[0].Rev
	s.cfg.Metrics.Received.Add(float64(len(rev)))
	if rv <= s.lastEvent {
		s.cfg.Metrics.Replayed.Add(float64(len(rev)))
		// At info level: a repeat is etcd's client misbehaving, rare, and
		// what a fault scenario's log needs to show.
		klog.InfoS("Dropped a revision etcd delivered again", "resource", s.cfg.GroupResource, "resourceVersion", rv,
			"events", len(rev), "lastEvent", s.lastEvent)
		return nil
	}
	s.checkOrder(rv, len(rev))
	s.lastEvent = rv
	s.cfg.Metrics.ResourceVersion(rv)
	now := s.cfg.Clock.Now().UnixNano()
	events := make([]*fanout.Event, 0, len(rev))
	// changed holds this revision's objects by key, should etcd ever
	// change a key twice in one revision (it refuses such transactions).
	var changed map[string]*object.Object
	for _, ch := range rev {
		prev, ok := changed[ch.Key]
		if !ok {
			prev, _ = s.cfg.Objects.Get(ch.Key)
		}
		if ch.Deleted && prev == nil {
			continue // Deleting what the cache never held: nothing to tell.
		}
		o, err := s.object(ch, prev)
		if err != nil {
			return fmt.Errorf("%s at %d: %w", ch.Key, ch.Rev, err)
		}
		e := &fanout.Event{Key: eventKey(ch, o), Rev: rv, Cur: o, Prev: prev, Seen: now}
		if !decoded.IsZero() {
			// The dispatch latency compares real times, as the decode time is.
			e.Decoded, e.Received = decoded.UnixNano(), time.Now().UnixNano()
		}
		switch {
		case ch.Deleted:
			e.Type = watch.Deleted
		case prev == nil:
			e.Type = watch.Added
		default:
			e.Type = watch.Modified
		}
		events = append(events, e)
		if len(rev) > 1 {
			if changed == nil {
				changed = make(map[string]*object.Object, len(rev))
			}
			changed[ch.Key] = o
			if ch.Deleted {
				changed[ch.Key] = nil
			}
		}
	}
	if len(events) == 0 {
		s.cfg.Sink.Progress(rv)
		return nil
	}
	s.cfg.Sink.Process(events...)
	return nil
}

// object builds the cached version of a change: its object, or for a
// deletion whose last value etcd did not send, the held one at the
// deletion's revision.
func (s *Source) object(ch Change, prev *object.Object) (*object.Object, error) {
	if ch.Held != nil {
		return ch.Held, nil
	}
	if ch.Object != nil {
		return s.cfg.Build.Build(ch.Object)
	}
	return prev.At(s.cfg.Versioner, ch.Rev)
}

// checkOrder reports a revision newer than every event before it but not
// newer than the head: a progress notification reported a revision before
// etcd delivered all of its events. Lists served at the head in between
// lacked the events. etcd sends a notification only once a watch has sent
// everything up to it, and the cache's watch has a stream of its own, so
// this says, should it ever happen, where. The revision is applied.
func (s *Source) checkOrder(rv uint64, n int) {
	if _, head := s.cfg.History.Bounds(); rv <= head {
		klog.ErrorS(nil, "etcd delivered a revision after a progress notification past it", "resource", s.cfg.GroupResource,
			"resourceVersion", rv, "events", n, "lastEvent", s.lastEvent, "head", head)
	}
}

// eventKey is ch's key as o, the event's object, holds it: the change's
// own string, read from etcd's key, would be a second copy of the key for
// as long as the history holds the event, 48 B an event for the keys of
// the realistic corpus.
func eventKey(ch Change, o *object.Object) string {
	if o != nil && o.Key == ch.Key {
		return o.Key
	}
	return ch.Key
}
