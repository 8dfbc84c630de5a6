package cacher

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// encodingExpiry forgets the encodings cached objects keep, ttl after the
// first one was made. Encode-once matters while an event or a watch-list's
// initial state is being sent to many watchers, which takes seconds; kept
// for as long as the object is current, the encodings would add about the
// object's serialized size to every object ever sent, for good. Upstream
// keeps an event's encodings only while it is dispatched.
type encodingExpiry struct {
	ttl   time.Duration
	clock clock.PassiveClock

	// mu guards queue.
	mu sync.Mutex
	// queue holds objects in the order their first encoding was made.
	queue []expiring
}

type expiring struct {
	o  *cachingObject
	at time.Time
}

func newEncodingExpiry(ttl time.Duration, clk clock.PassiveClock) *encodingExpiry {
	return &encodingExpiry{ttl: ttl, clock: clk}
}

// add records that o made its first encoding now.
func (x *encodingExpiry) add(o *cachingObject) {
	now := x.clock.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.queue = append(x.queue, expiring{o: o, at: now})
}

// expire drops the encodings of every object whose first encoding is ttl
// old, and returns how many objects it cleared.
func (x *encodingExpiry) expire() int {
	now := x.clock.Now()
	x.mu.Lock()
	i := 0
	for i < len(x.queue) && now.Sub(x.queue[i].at) >= x.ttl {
		i++
	}
	due := make([]*cachingObject, i)
	for j := range i {
		due[j] = x.queue[j].o
	}
	// Clearing lets the objects be collected; append reallocates the
	// shrinking slice in time, so this stays amortized O(1).
	clear(x.queue[:i])
	x.queue = x.queue[i:]
	x.mu.Unlock()
	for _, o := range due {
		o.dropEncodings()
	}
	return len(due)
}

// len returns how many objects hold encodings that will expire.
func (x *encodingExpiry) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.queue)
}
