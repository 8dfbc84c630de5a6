package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// How a watch connection ended.
const (
	end410    = "410"
	endError  = "error"
	endClosed = "closed"
	endCancel = "cancel"
	// endBack: the client stopped reading to watch again from another
	// resourceVersion it was handed.
	endBack = "back"
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
	// pause is how long the consumer takes over each event, as a slow
	// agent does: the server must neither close it nor lose its events.
	pause time.Duration
	// backEvery and backIdle make the client go back, after that many
	// events or that long without one, to any resourceVersion it was
	// handed (a list's, an event's, a bookmark's, a watch-list's end) and
	// watch from there; 0 never.
	backEvery int
	backIdle  time.Duration
	// retry, when set, is the backoff between failed opens in place of
	// the default, 50 ms doubling to 1 s.
	retry *wait.Backoff
}

// backoff is a fresh backoff between s's failed opens.
func (s watchSpec) backoff() wait.Backoff {
	if s.retry != nil {
		return *s.retry
	}
	return wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Second}
}

// received is one event or bookmark a stream delivered after its initial state.
type received struct {
	typ watch.EventType
	key string
	rv  int64
	at  time.Time
}

// segment is one watch connection's stream, from the resourceVersion it
// started after: a list's or a watch-list's, or one the client held.
type segment struct {
	from   int64
	events []received
	// last is the newest resourceVersion it delivered: where the next
	// watch resumes.
	last int64
	// initial collects a watch-list's initial state until its end
	// bookmark; nil once the state is complete.
	initial map[string]int64
	// cut says the client, not the server, stopped reading it.
	cut bool
	// synced is when a list or a watch-list's end handed the segment its
	// start; zero for a segment that resumes.
	synced time.Time
}

// check is the segment as the checker reads it.
func (s *segment) check() watchcheck.Segment {
	out := watchcheck.Segment{From: s.from, Cut: s.cut, Items: make([]watchcheck.Item, len(s.events))}
	for i, e := range s.events {
		out.Items[i] = watchcheck.Item{Type: e.typ, Key: e.key, Rev: e.rv}
	}
	return out
}

// connEnd is how one watch connection ended.
type connEnd struct {
	reason string
	at     time.Time
	msg    string
	// from is the resourceVersion the connection watched from.
	from int64
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
	rnd     *rand.Rand

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
	// handed holds the resourceVersions the client was handed.
	handed []int64
	// settled stops going back: the run is ending.
	settled bool
}

func newStream(spec watchSpec, client versioned.Interface, lists *listLog, acked func() int64) *stream {
	return &stream{spec: spec, client: client, lists: lists, acked: acked, pauseCh: make(chan time.Duration, 1),
		seen: map[string]time.Time{}, rnd: rand.New(rand.NewPCG(uint64(len(spec.name)), uint64(spec.probeFrom)))}
}

// pause makes the consumer stop reading for d, as a stalled client does.
func (s *stream) pause(d time.Duration) { s.pauseCh <- d }

// settle stops the client going back to older resourceVersions, so that
// it reads on to the end of the run.
func (s *stream) settle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled = true
}

func (s *stream) opts() metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: s.spec.sel.label, FieldSelector: s.spec.sel.field, AllowWatchBookmarks: s.spec.bookmarks}
}

// list lists the stream's resource with opts, and returns the list's
// resourceVersion and its items' keys and resourceVersions.
func (s *stream) list(ctx context.Context, opts metav1.ListOptions) (int64, map[string]int64, error) {
	if s.spec.sel.resource == agentsRes {
		l, err := s.client.FleetV1beta1().Agents().List(ctx, opts)
		if err != nil {
			return 0, nil, err
		}
		items := map[string]int64{}
		for _, a := range l.Items {
			items[a.Name] = parseRV(a.ResourceVersion)
		}
		return parseRV(l.ResourceVersion), items, nil
	}
	l, err := s.client.FleetV1beta1().Assignments(s.spec.sel.namespace).List(ctx, opts)
	if err != nil {
		return 0, nil, err
	}
	return parseRV(l.ResourceVersion), itemsOf(l.Items), nil
}

// watch watches the stream's resource with opts.
func (s *stream) watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if s.spec.sel.resource == agentsRes {
		return s.client.FleetV1beta1().Agents().Watch(ctx, opts)
	}
	return s.client.FleetV1beta1().Assignments(s.spec.sel.namespace).Watch(ctx, opts)
}

// keyOf is the harness's key of an object a stream received.
func (s *stream) keyOf(m metav1.Object) string {
	if s.spec.sel.resource == agentsRes {
		return m.GetName()
	}
	return m.GetNamespace() + "/" + m.GetName()
}

// run syncs and watches until ctx ends.
func (s *stream) run(ctx context.Context) {
	if s.spec.probeFrom != 0 {
		s.probe(ctx)
		return
	}
	backoff := s.spec.backoff()
	var seg *segment
	first := true
	for ctx.Err() == nil {
		opts := s.opts()
		if seg == nil {
			relist := !first
			first = false
			if s.spec.watchList {
				opts.SendInitialEvents = ptr.To(true)
				opts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
				opts.AllowWatchBookmarks = true
				seg = &segment{initial: map[string]int64{}}
			} else {
				var err error
				if seg, err = s.sync(ctx); err != nil {
					// The next try is the same sync, not another re-list.
					first = !relist
					s.failedOpen(ctx, &backoff, err)
					continue
				}
			}
			if relist {
				s.mu.Lock()
				s.relists++
				s.mu.Unlock()
			}
		}
		if seg.initial == nil {
			opts.ResourceVersion = strconv.FormatInt(seg.from, 10)
		}
		w, err := s.watch(ctx, opts)
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				s.mu.Lock()
				s.ends = append(s.ends, connEnd{reason: end410, at: time.Now(), msg: err.Error(), from: seg.from})
				s.mu.Unlock()
				seg = nil
				continue
			}
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
		e, next := s.consume(ctx, w, seg)
		e.lasted = e.at.Sub(opened)
		w.Stop()
		s.mu.Lock()
		s.ends = append(s.ends, e)
		s.mu.Unlock()
		switch {
		case e.reason == end410 || seg.initial != nil:
			seg = nil
		default:
			// Each connection is a segment of its own, from where the
			// client resumes.
			seg = &segment{from: next, last: next}
		}
		if e.reason != endCancel {
			backoff = s.spec.backoff()
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

// sync reads the selected objects with a consistent list and starts a segment at its resourceVersion.
func (s *stream) sync(ctx context.Context) (*segment, error) {
	minRV := s.acked()
	rv, items, err := s.list(ctx, s.opts())
	if err != nil {
		return nil, err
	}
	s.lists.add(listResult{who: s.spec.name, sel: s.spec.sel, rv: rv, items: items, consistent: true, minRV: minRV})
	s.mu.Lock()
	s.markSeenLocked(items, time.Now())
	s.handed = append(s.handed, rv)
	s.mu.Unlock()
	return &segment{from: rv, last: rv, synced: time.Now()}, nil
}

// consume reads one watch connection until it ends, or until the client
// goes back to an older resourceVersion it holds. It returns how the
// connection ended and where the next resumes.
func (s *stream) consume(ctx context.Context, w watch.Interface, seg *segment) (connEnd, int64) {
	delivered := 0
	var idle <-chan time.Time
	for {
		if seg.initial == nil && s.spec.backIdle > 0 && idle == nil {
			idle = time.After(s.spec.backIdle)
		}
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			seg.cut = true
			return connEnd{reason: endCancel, at: time.Now(), from: seg.from}, seg.last
		case d := <-s.pauseCh:
			select {
			case <-ctx.Done():
			case <-time.After(d): // the stalled client's pause itself
			}
			continue
		case <-idle:
			idle = nil
			if back, ok := s.goBack(seg); ok {
				return connEnd{reason: endBack, at: time.Now(), from: seg.from}, back
			}
			continue
		case ev, ok = <-w.ResultChan():
			idle = nil
		}
		now := time.Now()
		// The test's own cancel ends the watch with a closed channel, or
		// with an error event: client-go's watcher reports the body read
		// the cancel ended ("unable to decode an event from the watch
		// stream: context canceled").
		if (!ok || ev.Type == watch.Error) && ctx.Err() != nil {
			seg.cut = true
			return connEnd{reason: endCancel, at: now, from: seg.from}, seg.last
		}
		if !ok {
			return connEnd{reason: endClosed, at: now, empty: delivered == 0, from: seg.from}, seg.last
		}
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return connEnd{reason: end410, at: now, msg: err.Error(), from: seg.from}, 0
			}
			return connEnd{reason: endError, at: now, msg: err.Error(), from: seg.from}, seg.last
		}
		m, err := meta.Accessor(ev.Object)
		if err != nil {
			return connEnd{reason: endError, at: now, msg: "unexpected object in a watch event", from: seg.from}, seg.last
		}
		rv := parseRV(m.GetResourceVersion())
		key := s.keyOf(m)
		s.mu.Lock()
		switch {
		case seg.initial != nil && ev.Type == watch.Bookmark && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true":
			// The watch-list's state is complete at rv.
			s.lists.add(listResult{who: s.spec.name + " (watch-list)", sel: s.spec.sel, rv: rv, items: seg.initial})
			s.markSeenLocked(seg.initial, now)
			seg.initial, seg.from, seg.last, seg.synced = nil, rv, rv, now
			s.handed = append(s.handed, rv)
		case seg.initial != nil && ev.Type == watch.Added:
			seg.initial[key] = rv
		default:
			delivered++
			seg.events = append(seg.events, received{typ: ev.Type, key: key, rv: rv, at: now})
			seg.last = rv
			s.handed = append(s.handed, rv)
			if _, ok := s.seen[key]; !ok && ev.Type != watch.Bookmark {
				s.seen[key] = now
			}
		}
		s.mu.Unlock()
		if s.spec.pause > 0 {
			time.Sleep(s.spec.pause) // the slow consumer's own work
		}
		if s.spec.backEvery > 0 && seg.initial == nil && len(seg.events) >= s.spec.backEvery {
			if back, ok := s.goBack(seg); ok {
				return connEnd{reason: endBack, at: time.Now(), from: seg.from}, back
			}
		}
	}
}

// goBack picks a resourceVersion the client was handed to watch from next,
// and cuts seg, unless the run is ending.
func (s *stream) goBack(seg *segment) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.settled || len(s.handed) == 0 {
		return 0, false
	}
	seg.cut = true
	return s.handed[s.rnd.IntN(len(s.handed))], true
}

// probe opens one watch from an old resourceVersion and reads it for a
// second: it must get a 410 or the events after that resourceVersion.
func (s *stream) probe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	opts := s.opts()
	opts.ResourceVersion = strconv.FormatInt(s.spec.probeFrom, 10)
	w, err := s.watch(ctx, opts)
	if err != nil {
		s.mu.Lock()
		s.openErrs++
		s.mu.Unlock()
		return
	}
	defer w.Stop()
	seg := &segment{from: s.spec.probeFrom, last: s.spec.probeFrom}
	s.addSegment(seg)
	e, _ := s.consume(ctx, w, seg)
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
