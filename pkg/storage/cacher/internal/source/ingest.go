package source

import (
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// replayed reports whether o, from an etcd event, is one the cache already
// applied. etcd sends a watch's events in revision order, but a watch its
// client resumed on another member can start below the revision the cache
// asked for and repeat events (etcd-io/etcd#20221: the client takes its
// resume revision from a progress notification of a member that is
// behind). Applied again, such an event would put an old version back in
// the store, under a newer resourceVersion: the state lists read. An event
// below the head is a repeat; one at the head is if the store holds its
// key at that revision already, as the other keys of a transaction, which
// share its revision, are not.
func (s *Source) replayed(o, prev *object.Object) bool {
	head := s.head()
	return o.RV < head || (o.RV == head && prev != nil && prev.RV == o.RV)
}

// checkOrder reports an event newer than every event before it but not
// newer than the head: a progress notification reported a revision before
// etcd delivered all of its events. Lists served at the head in between
// lacked the event. A fault scenario saw such a list twice (a paged list at
// 117 holding an object deleted at 117, with every stream right); this
// says, next time, whether this is how. It changes nothing.
func (s *Source) checkOrder(o *object.Object, typ watch.EventType) {
	head := s.head()
	if o.RV > s.lastEvent && o.RV <= head {
		klog.InfoS("etcd delivered an event after a progress notification past it", "resource", s.cfg.GroupResource,
			"key", o.Key, "type", typ, "resourceVersion", o.RV, "lastEvent", s.lastEvent, "head", head)
	}
	s.lastEvent = max(s.lastEvent, o.RV)
}

// ingest turns one etcd event into a cached event. decoded is when the
// etcd3 store decoded it, if it said.
func (s *Source) ingest(ev watch.Event, decoded time.Time) error {
	o, err := s.cfg.Build.Build(ev.Object)
	if err != nil {
		return err
	}
	s.cfg.Metrics.Received.Inc()
	prev, _ := s.cfg.Objects.Get(o.Key)
	s.checkOrder(o, ev.Type)
	if s.replayed(o, prev) {
		s.cfg.Metrics.Replayed.Inc()
		// At info level: a repeat is etcd's client misbehaving, rare, and
		// what a fault scenario's log needs to show.
		klog.InfoS("Dropped an event etcd delivered again", "resource", s.cfg.GroupResource, "key", o.Key, "type", ev.Type,
			"resourceVersion", o.RV, "head", s.head())
		return nil
	}
	s.cfg.Metrics.ResourceVersion(o.RV)
	e := &fanout.Event{Key: o.Key, Rev: o.RV, Cur: o, Prev: prev, Seen: s.cfg.Clock.Now().UnixNano()}
	if !decoded.IsZero() {
		// The dispatch latency compares real times, as the decode time is.
		e.Decoded, e.Received = decoded.UnixNano(), time.Now().UnixNano()
	}
	switch {
	case ev.Type == watch.Deleted && prev == nil:
		// Deleting what the cache never held: nothing to tell watchers.
		s.cfg.Sink.Progress(o.RV)
		return nil
	case ev.Type == watch.Deleted:
		e.Type = watch.Deleted
	case prev == nil:
		e.Type = watch.Added
	default:
		e.Type = watch.Modified
	}
	s.cfg.Sink.Process(e)
	return nil
}

// handle applies one event from the etcd watch. stop is true when the
// event ends the watch.
func (s *Source) handle(ev watch.Event) (end End, stop bool) {
	var decoded time.Time
	ev, decoded = UnwrapRecordTime(ev)
	switch ev.Type {
	case watch.Bookmark:
		rv, err := s.cfg.Versioner.ObjectResourceVersion(ev.Object)
		if err != nil {
			return End{Reason: EndUnreadable, Relist: true, Err: err}, true
		}
		s.cfg.Sink.Progress(rv)
	case watch.Added, watch.Modified, watch.Deleted:
		if err := s.ingest(ev, decoded); err != nil {
			return End{Reason: EndUnreadable, Relist: true, Err: err}, true
		}
	case watch.Error:
		return Classify(apierrors.FromObject(ev.Object)), true
	}
	return End{}, false
}
