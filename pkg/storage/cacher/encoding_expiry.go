package cacher

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// encodingExpiry forgets the cachingObjects cached objects keep, with their
// encodings, ttl after they were made. Encode-once matters while an event
// or a watch-list's initial state is being sent to many watchers, which
// takes seconds; kept
// for as long as the object is current, the encodings would add about the
// object's serialized size to every object ever sent, for good. Upstream
// keeps an event's encodings only while it is dispatched.
type encodingExpiry struct {
	ttl   time.Duration
	clock clock.PassiveClock

	// mu guards queue.
	mu sync.Mutex
	// queue holds cachingObjects in the order they were made.
	queue []expiring
}

type expiring struct {
	o  *cachingObject
	at time.Time
}

func newEncodingExpiry(ttl time.Duration, clk clock.PassiveClock) *encodingExpiry {
	return &encodingExpiry{ttl: ttl, clock: clk}
}

// add records that o was made now.
func (x *encodingExpiry) add(o *cachingObject) {
	now := x.clock.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.queue = append(x.queue, expiring{o: o, at: now})
}

// expire drops every cachingObject made ttl ago, and returns how many.
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
		o.expire()
	}
	return len(due)
}

// len returns how many cachingObjects will expire.
func (x *encodingExpiry) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.queue)
}
