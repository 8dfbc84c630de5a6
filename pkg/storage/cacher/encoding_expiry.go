package cacher

import (
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// encodingExpiry forgets the cachingObjects cached objects keep, with their
// encodings, once no sender has asked for them for ttl. Encode-once matters
// while an event or watch-lists' initial states are being sent to many
// watchers, which takes seconds, or, for watch-lists taking turns over
// 100,000 objects, a minute; kept for as long as the object is current, the
// encodings would add about the object's serialized size to every object
// ever sent, for good. Upstream keeps an event's encodings only while it is
// dispatched.
//
// A cachingObject is checked ttl after it was made, and then every ttl
// while it is used: it goes at the first check that finds a whole ttl
// without a send, between one and two ttls after its last.
type encodingExpiry struct {
	ttl   time.Duration
	clock clock.PassiveClock
	// now is the time of the last expire, in Unix nanoseconds: what touch
	// records, so that a sender reads no clock.
	now atomic.Int64

	// mu guards queue.
	mu sync.Mutex
	// queue holds cachingObjects in the order of their at.
	queue []expiring
}

// expiring is a cachingObject checked for use ttl after at.
type expiring struct {
	o  *cachingObject
	at time.Time
}

func newEncodingExpiry(ttl time.Duration, clk clock.PassiveClock) *encodingExpiry {
	x := &encodingExpiry{ttl: ttl, clock: clk}
	x.now.Store(clk.Now().UnixNano())
	return x
}

// touch records that o is being sent, which keeps its encodings another ttl.
func (x *encodingExpiry) touch(o *cachingObject) {
	// Loads first: many senders touch one object, and a store per send
	// would bounce its cache line between them.
	if now := x.now.Load(); o.used.Load() < now {
		o.used.Store(now)
	}
}

// add records that o was made now.
func (x *encodingExpiry) add(o *cachingObject) {
	now := x.clock.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.queue = append(x.queue, expiring{o: o, at: now})
}

// expire drops every cachingObject that was checked in at least ttl ago
// and not touched since, queues the touched ones again from now, and
// returns how many it dropped.
func (x *encodingExpiry) expire() int {
	now := x.clock.Now()
	nowNano := now.UnixNano()
	x.now.Store(nowNano)
	x.mu.Lock()
	i := 0
	for i < len(x.queue) && now.Sub(x.queue[i].at) >= x.ttl {
		i++
	}
	var due []*cachingObject
	for _, e := range x.queue[:i] {
		if nowNano-e.o.used.Load() < int64(x.ttl) {
			// Appended at now, after every entry: the queue stays in order.
			x.queue = append(x.queue, expiring{o: e.o, at: now})
			continue
		}
		due = append(due, e.o)
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
