// Package history is the watch cache's event history: a ring buffer of
// recent events, in resourceVersion order, that every watcher reads through
// its own cursor. It knows of an event only its resourceVersion, when it
// was recorded and its size.
package history

import (
	"sync"
	"time"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
)

// Entry is what the log needs of an event.
type Entry interface {
	// RV is the event's resourceVersion.
	RV() uint64
	// Recorded is when the event was seen, for the history window.
	Recorded() time.Time
	// Size is the bytes the event holds, for the byte budget.
	Size() int64
}

// Config sizes a Log.
type Config struct {
	// Window is how long events are kept when room allows.
	Window time.Duration
	// MinSize and MaxSize bound the ring's capacity.
	MinSize, MaxSize int
	// Budget is the most bytes of events the log holds; 0 is no budget.
	Budget int64
}

// Log is the shared history of recent events: a ring buffer that every
// watcher reads through its own cursor. It is complete from resourceVersion
// since: every event after since up to head is in it.
//
// It holds whole revisions. etcd gives one revision to every key a
// transaction or a lease revocation changes, so a revision can have many
// events: they are appended together and leave together, and a reader
// (After) never sees part of one. A position inside a revision (Pos) is
// what a watcher parked in the middle of one resumes from.
//
// Capacity adapts. When the ring is full and its oldest event is still
// inside the history window, the ring doubles, up to maxSize. When it is
// full and fewer than a quarter of its events are inside the window, it
// halves, down to minSize. Otherwise the oldest event is dropped.
//
// A byte budget bounds it too: when the objects its events hold exceed
// budget, the oldest events go first, window or not, and evicted counts
// those that left while still inside the window.
type Log[E Entry] struct {
	window  time.Duration
	minSize int
	maxSize int
	// budget is the most bytes of objects the log holds; 0 is no budget.
	budget int64

	// mu guards everything below.
	mu sync.RWMutex
	// ring holds events; start indexes the oldest and n counts them.
	ring  []E
	start int
	n     int
	// since is the resourceVersion the log is complete from.
	since uint64
	// head is the newest resourceVersion the log knows of, from an event
	// or a progress notification.
	head uint64
	// generation counts resets, and trimmed whether events were dropped
	// since the last one: a backfill may only fill a log that kept
	// everything since it started.
	generation uint64
	trimmed    bool
	// bytes is the sum of the events' sizes; evicted counts the events the
	// budget removed inside the window.
	bytes   int64
	evicted uint64
}

// New returns an empty log, complete from resourceVersion 0.
func New[E Entry](c Config) *Log[E] {
	return &Log[E]{window: c.Window, minSize: c.MinSize, maxSize: c.MaxSize, budget: max(c.Budget, 0), ring: make([]E, c.MinSize)}
}

// Reset empties the log; it is complete from rv on.
func (l *Log[E]) Reset(rv uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring = make([]E, l.minSize)
	l.start, l.n, l.bytes = 0, 0, 0
	l.since, l.head = rv, rv
	l.generation++
	l.trimmed = false
}

// Resets returns how many times the log was reset.
func (l *Log[E]) Resets() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.generation
}

// Fillable reports whether Prepend could still fill the log of generation:
// it was neither reset nor trimmed since.
func (l *Log[E]) Fillable(generation uint64) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.generation == generation && !l.trimmed
}

// Prepend puts older history in front of the log: events, in order, after
// from and up to upTo, the revision the log was reset at generation. The
// log is then complete from from, or from the newest event that did not
// fit. It fails, changing nothing, if the log was reset or trimmed since.
func (l *Log[E]) Prepend(events []E, from, upTo, generation uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.generation != generation || l.trimmed || (l.n > 0 && l.ring[l.start].RV() <= upTo) {
		return false
	}
	size := len(l.ring)
	for size < len(events)+l.n && size < l.maxSize {
		size *= 2
	}
	size = min(size, l.maxSize)
	drop := len(events) + l.n - size
	if drop > len(events) {
		return false
	}
	if l.budget > 0 {
		// Keep only the newest events that fit beside what the log holds.
		var fit int64
		for i := len(events) - 1; i >= max(drop, 0); i-- {
			if fit += events[i].Size(); l.bytes+fit > l.budget {
				drop = i + 1
				break
			}
		}
	}
	// Whole revisions only: the rest of a revision whose first events do
	// not fit goes too.
	for drop > 0 && drop < len(events) && events[drop].RV() == events[drop-1].RV() {
		drop++
	}
	ring := make([]E, size)
	n := 0
	since := from
	if drop > 0 {
		since = events[drop-1].RV()
		events = events[drop:]
	}
	for _, e := range events {
		ring[n] = e
		n++
		l.bytes += e.Size()
	}
	for i := 0; i < l.n; i++ {
		ring[n] = l.ring[(l.start+i)%len(l.ring)]
		n++
	}
	l.ring, l.start, l.n, l.since = ring, 0, n, since
	return true
}

// Append adds one revision's events, in etcd's order, all at once: no
// reader sees part of them. Their revision must be newer than every event's
// in the log. It may be at or below head, which a progress notification
// moves: the caller decides what such an event means.
func (l *Log[E]) Append(rev ...E) {
	if len(rev) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	last := rev[len(rev)-1]
	for l.n+len(rev) > len(l.ring) {
		l.makeRoomLocked(last.Recorded(), len(rev))
	}
	for _, e := range rev {
		l.ring[(l.start+l.n)%len(l.ring)] = e
		l.n++
		l.bytes += e.Size()
	}
	l.head = max(l.head, last.RV())
	// The revision just appended stays, whatever its size.
	for l.budget > 0 && l.bytes > l.budget && l.n > len(rev) {
		inWindow := last.Recorded().Sub(l.ring[l.start].Recorded()) < l.window
		if n := l.dropOldestLocked(); inWindow {
			l.evicted += uint64(n)
		}
	}
}

// Advance moves head to rv on a progress notification, without an event.
// It leaves since alone: the log stays complete from since, so that every
// resourceVersion a client was handed in between stays watchable. Moving
// since up to rv when the log was empty made a watch from a list's
// resourceVersion get 410 once an idle resource heard a progress
// notification (issue 56).
func (l *Log[E]) Advance(rv uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if inject.On(inject.FloorOnProgress) && l.n == 0 && rv > l.since {
		l.since = rv
	}
	l.head = max(l.head, rv)
}

// makeRoomLocked makes room for more of a revision of size events in a
// ring too full for them: it grows the ring, shrinks it once most of it is
// outside the window, or drops the oldest revision.
func (l *Log[E]) makeRoomLocked(now time.Time, size int) {
	if l.n == 0 {
		// A revision larger than the ring at its largest: the ring grows
		// past maxSize rather than hold part of it.
		l.resizeLocked(max(size, 2*len(l.ring)), 0)
		return
	}
	oldest := l.ring[l.start]
	inWindow := now.Sub(oldest.Recorded()) < l.window
	switch {
	case inWindow && len(l.ring) < l.maxSize:
		l.resizeLocked(min(2*len(l.ring), l.maxSize), 0)
	case !inWindow && len(l.ring) > l.minSize && l.fewInWindowLocked(now):
		l.resizeLocked(max(len(l.ring)/2, l.minSize), size)
	default:
		l.dropOldestLocked()
	}
}

// dropOldestLocked drops the oldest revision, every event of it, and
// returns how many events that was.
func (l *Log[E]) dropOldestLocked() int {
	l.trimmed = true
	rv := l.ring[l.start].RV()
	n := 0
	var zero E
	for l.n > 0 && l.ring[l.start].RV() == rv {
		l.bytes -= l.ring[l.start].Size()
		l.ring[l.start] = zero
		l.start = (l.start + 1) % len(l.ring)
		l.n--
		n++
	}
	l.since = rv
	return n
}

// resizeLocked moves the events into a ring of the given size, dropping
// the oldest revisions until room more events fit beside them.
func (l *Log[E]) resizeLocked(size, room int) {
	for l.n > 0 && l.n+room > size {
		l.dropOldestLocked()
	}
	ring := make([]E, size)
	for i := 0; i < l.n; i++ {
		ring[i] = l.ring[(l.start+i)%len(l.ring)]
	}
	l.ring, l.start = ring, 0
}

// fewInWindowLocked reports whether fewer than a quarter of the ring's
// slots hold events inside the window at now: whether the quarter-th
// newest event is outside it, as events are appended in the order they
// were recorded. It used to count them, which on a full ring at 100 writes
// a second and 75 s of window was 7,500 steps an append: 4% of the
// server's CPU under the agents workload (docs/benchmarks.md).
func (l *Log[E]) fewInWindowLocked(now time.Time) bool {
	q := len(l.ring) / 4
	switch {
	case q == 0:
		return false
	case l.n < q:
		return true
	}
	return now.Sub(l.ring[(l.start+l.n-q)%len(l.ring)].Recorded()) >= l.window
}

// Pos is a place in the log: after every event up to resourceVersion RV,
// and after the first N events of the revision that follows. N is 0 but
// for a reader that stopped inside a revision.
type Pos struct {
	RV uint64
	N  int
}

// At is the place after every event up to rv.
func At(rv uint64) Pos { return Pos{RV: rv} }

// Before reports whether p is before o.
func (p Pos) Before(o Pos) bool { return p.RV < o.RV || (p.RV == o.RV && p.N < o.N) }

// After returns up to limit events after p, in order, and the place after
// them. A batch that ends inside a revision leaves next inside it; one that
// reaches the newest event leaves next after its whole revision, since a
// revision is appended at once. ok is false when p is older than the log:
// events after it were dropped, so a watcher at p cannot be served.
func (l *Log[E]) After(p Pos, limit int) (events []E, next Pos, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if p.RV < l.since {
		return nil, p, false
	}
	i := min(l.searchLocked(p.RV)+p.N, l.n)
	for ; i < l.n && len(events) < limit; i++ {
		events = append(events, l.at(i))
	}
	if len(events) == 0 {
		return nil, p, true
	}
	rv := events[len(events)-1].RV()
	if i == l.n || l.at(i).RV() != rv {
		return events, At(rv), true
	}
	// Inside revision rv: after the events of it up to i. Revisions are
	// whole in the log, so its first event is in it.
	first := l.searchLocked(rv - 1)
	return events, Pos{RV: rv - 1, N: i - first}, true
}

// at returns the i-th oldest event.
func (l *Log[E]) at(i int) E { return l.ring[(l.start+i)%len(l.ring)] }

// Between returns the events with resourceVersions in (rv, upTo], in
// order; ok is false when the log no longer holds all of them.
func (l *Log[E]) Between(rv, upTo uint64) (events []E, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if rv < l.since {
		return nil, false
	}
	for i := l.searchLocked(rv); i < l.n; i++ {
		e := l.ring[(l.start+i)%len(l.ring)]
		if e.RV() > upTo {
			break
		}
		events = append(events, e)
	}
	return events, true
}

// searchLocked returns the index of the first event newer than rv.
func (l *Log[E]) searchLocked(rv uint64) int {
	lo, hi := 0, l.n
	for lo < hi {
		mid := (lo + hi) / 2
		if l.ring[(l.start+mid)%len(l.ring)].RV() <= rv {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Bounds returns since and head.
func (l *Log[E]) Bounds() (since, head uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.since, l.head
}

// Capacity returns the ring's size, for metrics and tests.
func (l *Log[E]) Capacity() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.ring)
}

// Usage returns the bytes the log's events hold, and how many events the
// budget evicted inside the window so far.
func (l *Log[E]) Usage() (bytes int64, evicted uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.bytes, l.evicted
}

// Len returns how many events the log holds.
func (l *Log[E]) Len() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.n
}

// DropUpTo drops every event at or before rv, as if the log had aged them
// out. Tests use it to make the cache lose history.
func (l *Log[E]) DropUpTo(rv uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.n > 0 && l.ring[l.start].RV() <= rv {
		l.dropOldestLocked()
	}
	if rv > l.since {
		l.since, l.trimmed = rv, true
	}
}
