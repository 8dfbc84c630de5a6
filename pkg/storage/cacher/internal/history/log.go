// Package history is the watch cache's event history: a ring buffer of
// recent events, in resourceVersion order, that every watcher reads through
// its own cursor. It knows of an event only its resourceVersion, when it
// was recorded and its size.
package history

import (
	"sync"
	"time"
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

// Append adds an event, which must be newer than head.
func (l *Log[E]) Append(e E) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == len(l.ring) {
		l.makeRoomLocked(e.Recorded())
	}
	l.ring[(l.start+l.n)%len(l.ring)] = e
	l.n++
	l.head = e.RV()
	l.bytes += e.Size()
	for l.budget > 0 && l.bytes > l.budget && l.n > 1 {
		if e.Recorded().Sub(l.ring[l.start].Recorded()) < l.window {
			l.evicted++
		}
		l.dropOldestLocked()
	}
}

// Advance moves head to rv on a progress notification, without an event.
func (l *Log[E]) Advance(rv uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rv > l.head {
		l.head = rv
		if l.n == 0 {
			// Nothing happened between since and rv, so the log is complete from rv.
			l.since = rv
		}
	}
}

func (l *Log[E]) makeRoomLocked(now time.Time) {
	oldest := l.ring[l.start]
	inWindow := now.Sub(oldest.Recorded()) < l.window
	switch {
	case inWindow && len(l.ring) < l.maxSize:
		l.resizeLocked(min(2*len(l.ring), l.maxSize))
	case !inWindow && len(l.ring) > l.minSize && l.fewInWindowLocked(now):
		l.dropOldestLocked()
		l.resizeLocked(max(len(l.ring)/2, l.minSize))
	default:
		l.dropOldestLocked()
	}
}

func (l *Log[E]) dropOldestLocked() {
	l.trimmed = true
	oldest := l.ring[l.start]
	var zero E
	l.ring[l.start] = zero
	l.start = (l.start + 1) % len(l.ring)
	l.n--
	l.since = oldest.RV()
	l.bytes -= oldest.Size()
}

// resizeLocked moves the events into a ring of the given size, dropping the
// oldest ones that do not fit.
func (l *Log[E]) resizeLocked(size int) {
	for l.n > size {
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

// After returns up to limit events with resourceVersion greater than rv, in
// order. ok is false when rv is older than the log: events after it were
// dropped, so a watcher at rv cannot be served.
func (l *Log[E]) After(rv uint64, limit int) (events []E, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if rv < l.since {
		return nil, false
	}
	i := l.searchLocked(rv)
	for ; i < l.n && len(events) < limit; i++ {
		events = append(events, l.ring[(l.start+i)%len(l.ring)])
	}
	return events, true
}

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
