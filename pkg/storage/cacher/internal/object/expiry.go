package object

import (
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Expiry forgets the Cachings cached objects keep, with their
// encodings, once no sender has asked for them for ttl. Encode-once matters
// while an event or watch-lists' initial states are being sent to many
// watchers, which takes seconds, or, for watch-lists taking turns over
// 100,000 objects, a minute; kept for as long as the object is current, the
// encodings would add about the object's serialized size to every object
// ever sent, for good. Upstream keeps an event's encodings only while it is
// dispatched.
//
// A Caching is checked ttl after it was made, and then every ttl
// while it is used: it goes at the first check that finds a whole ttl
// without a send, between one and two ttls after its last.
type Expiry struct {
	ttl   time.Duration
	clock clock.PassiveClock
	// now is the time of the last expire, in Unix nanoseconds: what touch
	// records, so that a sender reads no clock.
	now atomic.Int64

	// mu guards queue.
	mu sync.Mutex
	// queue holds Cachings in the order of their at.
	queue []expiring
}

// expiring is a Caching checked for use ttl after at.
type expiring struct {
	o  *Caching
	at time.Time
}

func NewExpiry(ttl time.Duration, clk clock.PassiveClock) *Expiry {
	x := &Expiry{ttl: ttl, clock: clk}
	x.now.Store(clk.Now().UnixNano())
	return x
}

// touch records that o is being sent, which keeps its encodings another ttl.
func (x *Expiry) touch(o *Caching) {
	// Loads first: many senders touch one object, and a store per send
	// would bounce its cache line between them.
	if now := x.now.Load(); o.used.Load() < now {
		o.used.Store(now)
	}
}

// add records that o was made now.
func (x *Expiry) add(o *Caching) {
	now := x.clock.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.queue = append(x.queue, expiring{o: o, at: now})
}

// Expire drops every Caching that was checked in at least ttl ago
// and not touched since, queues the touched ones again from now, and
// returns how many it dropped.
func (x *Expiry) Expire() int {
	now := x.clock.Now()
	nowNano := now.UnixNano()
	x.now.Store(nowNano)
	x.mu.Lock()
	i := 0
	for i < len(x.queue) && now.Sub(x.queue[i].at) >= x.ttl {
		i++
	}
	var due []*Caching
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

// Len returns how many Cachings will expire.
func (x *Expiry) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.queue)
}
