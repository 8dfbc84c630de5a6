package faults

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// How a watch connection ended.
const (
	end410    = "410"
	endError  = "error"
	endClosed = "closed"
	endCancel = "cancel"
)

// watchSpec is one raw watch client.
type watchSpec struct {
	name string
	sel  selector
	// bookmarks asks for bookmarks.
	bookmarks bool
	// watchList syncs with sendInitialEvents instead of a list.
	watchList bool
	// probeFrom, when set, makes a probe: one watch from this old
	// resourceVersion, never resumed, to see a 410 or the events after it.
	probeFrom int64
}

// received is one event or bookmark a stream delivered after its initial state.
type received struct {
	typ watch.EventType
	key string
	rv  int64
	at  time.Time
}

// segment is a stream's run from one list (or watch-list state) to the
// next: it resumes from the last resourceVersion seen after every end that
// is not a 410.
type segment struct {
	from   int64
	events []received
	// last is the resourceVersion the next watch resumes from.
	last int64
	// initial collects a watch-list's initial state until its end
	// bookmark; nil once the state is complete.
	initial map[string]int64
}

// connEnd is how one watch connection ended.
type connEnd struct {
	reason string
	at     time.Time
	msg    string
	// empty is whether the connection delivered nothing after its initial
	// state, not even a bookmark: client-go's reflector re-lists after
	// such a watch if it lasted under a second, and a server shutting down
	// bookmarks every watch that asked for bookmarks so that none is.
	empty bool
	// lasted is how long the watch was open.
	lasted time.Duration
}

// serverWatchTimeout is the shortest time the API server lets a watch
// without timeoutSeconds run: --min-request-timeout, 30 minutes by
// default, times a random factor in [1, 2). A clean close after it is
// the watch's normal end, not a fault's; only the soak runs that long.
const serverWatchTimeout = 30 * time.Minute

// timedOut tells whether the server ended the watch at its timeout.
func (e connEnd) timedOut() bool { return e.reason == endClosed && e.lasted >= serverWatchTimeout }

// stream is one raw HTTP watch client. It behaves as a reflector: list (or
// watch-list), watch from the list's resourceVersion, resume from the last
// resourceVersion seen whenever a watch ends, and list again only after a
// 410. Everything it receives is recorded for the invariants.
type stream struct {
	spec    watchSpec
	client  versioned.Interface
	lists   *listLog
	acked   func() int64
	pauseCh chan time.Duration

	// mu guards the records below.
	mu       sync.Mutex
	segments []*segment
	ends     []connEnd
	relists  int
	openErrs int
	// lastOpenErr is the last failure to open a list or watch, and when.
	lastOpenErr   error
	lastOpenErrAt time.Time
	// opened counts the watches opened.
	opened int
	// seen is when each key first arrived, for the sentinels.
	seen map[string]time.Time
}

func newStream(spec watchSpec, client versioned.Interface, lists *listLog, acked func() int64) *stream {
	return &stream{spec: spec, client: client, lists: lists, acked: acked, pauseCh: make(chan time.Duration, 1),
		seen: map[string]time.Time{}}
}

// pause makes the consumer stop reading for d, as a stalled client does.
func (s *stream) pause(d time.Duration) { s.pauseCh <- d }

func (s *stream) opts() metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: s.spec.sel.label, FieldSelector: s.spec.sel.field, AllowWatchBookmarks: s.spec.bookmarks}
}

func (s *stream) assignments() interface {
	List(context.Context, metav1.ListOptions) (*v1beta1.AssignmentList, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
} {
	return s.client.FleetV1beta1().Assignments(s.spec.sel.namespace)
}

// run syncs and watches until ctx ends.
func (s *stream) run(ctx context.Context) {
	if s.spec.probeFrom != 0 {
		s.probe(ctx)
		return
	}
	backoff := wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Second}
	var seg *segment
	first := true
	for ctx.Err() == nil {
		opts := s.opts()
		if seg == nil {
			if !first {
				s.mu.Lock()
				s.relists++
				s.mu.Unlock()
			}
			first = false
			if s.spec.watchList {
				opts.SendInitialEvents = ptr.To(true)
				opts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
				opts.AllowWatchBookmarks = true
				seg = &segment{initial: map[string]int64{}}
			} else {
				var err error
				if seg, err = s.list(ctx); err != nil {
					s.failedOpen(ctx, &backoff, err)
					continue
				}
			}
		}
		if seg.initial == nil {
			opts.ResourceVersion = strconv.FormatInt(seg.last, 10)
		}
		w, err := s.assignments().Watch(ctx, opts)
		if err != nil {
			if seg.initial != nil {
				seg = nil // the watch-list never started; sync again
				first = true
			}
			s.failedOpen(ctx, &backoff, err)
			continue
		}
		s.addSegment(seg)
		s.mu.Lock()
		s.opened++
		s.mu.Unlock()
		opened := time.Now()
		e := s.consume(ctx, w, seg)
		e.lasted = e.at.Sub(opened)
		w.Stop()
		s.mu.Lock()
		s.ends = append(s.ends, e)
		s.mu.Unlock()
		if e.reason == end410 || seg.initial != nil {
			seg = nil
		}
		if e.reason != endCancel {
			backoff = wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Second}
		}
	}
}

// addSegment records seg once.
func (s *stream) addSegment(seg *segment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.segments) == 0 || s.segments[len(s.segments)-1] != seg {
		s.segments = append(s.segments, seg)
	}
}

func (s *stream) failedOpen(ctx context.Context, backoff *wait.Backoff, err error) {
	s.mu.Lock()
	s.openErrs++
	s.lastOpenErr, s.lastOpenErrAt = err, time.Now()
	s.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-time.After(backoff.Step()):
	}
}

// list reads the selected objects with a consistent list and starts a segment at its resourceVersion.
func (s *stream) list(ctx context.Context) (*segment, error) {
	minRV := s.acked()
	l, err := s.assignments().List(ctx, s.opts())
	if err != nil {
		return nil, err
	}
	rv := parseRV(l.ResourceVersion)
	items := itemsOf(l.Items)
	s.lists.add(listResult{who: s.spec.name, sel: s.spec.sel, rv: rv, items: items, consistent: true, minRV: minRV})
	s.mu.Lock()
	s.markSeenLocked(items, time.Now())
	s.mu.Unlock()
	return &segment{from: rv, last: rv}, nil
}

// consume reads one watch connection until it ends.
func (s *stream) consume(ctx context.Context, w watch.Interface, seg *segment) connEnd {
	delivered := 0
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return connEnd{reason: endCancel, at: time.Now()}
		case d := <-s.pauseCh:
			select {
			case <-ctx.Done():
			case <-time.After(d): // the stalled client's pause itself
			}
			continue
		case ev, ok = <-w.ResultChan():
		}
		now := time.Now()
		// The test's own cancel ends the watch with a closed channel, or
		// with an error event: client-go's watcher reports the body read
		// the cancel ended ("unable to decode an event from the watch
		// stream: context canceled").
		if (!ok || ev.Type == watch.Error) && ctx.Err() != nil {
			return connEnd{reason: endCancel, at: now}
		}
		if !ok {
			return connEnd{reason: endClosed, at: now, empty: delivered == 0}
		}
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return connEnd{reason: end410, at: now, msg: err.Error()}
			}
			return connEnd{reason: endError, at: now, msg: err.Error()}
		}
		a, isAssignment := ev.Object.(*v1beta1.Assignment)
		if !isAssignment {
			return connEnd{reason: endError, at: now, msg: "unexpected object in a watch event"}
		}
		rv := parseRV(a.ResourceVersion)
		key := a.Namespace + "/" + a.Name
		s.mu.Lock()
		switch {
		case seg.initial != nil && ev.Type == watch.Bookmark && a.Annotations[metav1.InitialEventsAnnotationKey] == "true":
			// The watch-list's state is complete at rv.
			s.lists.add(listResult{who: s.spec.name + " (watch-list)", sel: s.spec.sel, rv: rv, items: seg.initial})
			s.markSeenLocked(seg.initial, now)
			seg.initial, seg.from, seg.last = nil, rv, rv
		case seg.initial != nil && ev.Type == watch.Added:
			seg.initial[key] = rv
		default:
			delivered++
			seg.events = append(seg.events, received{typ: ev.Type, key: key, rv: rv, at: now})
			seg.last = rv
			if _, ok := s.seen[key]; !ok && ev.Type != watch.Bookmark {
				s.seen[key] = now
			}
		}
		s.mu.Unlock()
	}
}

// probe opens one watch from an old resourceVersion and reads it for a
// second: it must get a 410 or the events after that resourceVersion.
func (s *stream) probe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	opts := s.opts()
	opts.ResourceVersion = strconv.FormatInt(s.spec.probeFrom, 10)
	w, err := s.assignments().Watch(ctx, opts)
	if err != nil {
		s.mu.Lock()
		s.openErrs++
		s.mu.Unlock()
		return
	}
	defer w.Stop()
	seg := &segment{from: s.spec.probeFrom, last: s.spec.probeFrom}
	s.addSegment(seg)
	e := s.consume(ctx, w, seg)
	s.mu.Lock()
	s.ends = append(s.ends, e)
	s.mu.Unlock()
}

// markSeenLocked records the keys of a list or watch-list state as
// arrived: a stream that re-synced has the objects it listed.
func (s *stream) markSeenLocked(items map[string]int64, at time.Time) {
	for key := range items {
		if _, ok := s.seen[key]; !ok {
			s.seen[key] = at
		}
	}
}

// history says, for a report, how s's last watch ended and when it last
// failed to open one, relative to since.
func (s *stream) history(since time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := fmt.Sprintf("%d watches opened", s.opened)
	if n := len(s.ends); n > 0 {
		e := s.ends[n-1]
		out += fmt.Sprintf(", the last ended (%s) at %+.2fs", e.reason, e.at.Sub(since).Seconds())
	}
	if s.lastOpenErr != nil {
		out += fmt.Sprintf(", the last failed open at %+.2fs: %v", s.lastOpenErrAt.Sub(since).Seconds(), s.lastOpenErr)
	}
	return out
}

// seenAt returns when key first arrived.
func (s *stream) seenAt(key string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.seen[key]
	return at, ok
}

// lastRV returns the newest resourceVersion s delivered, 0 before any.
func (s *stream) lastRV() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.segments) == 0 {
		return 0
	}
	return s.segments[len(s.segments)-1].last
}

// watchesOpened returns how many watches s opened.
func (s *stream) watchesOpened() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened
}
