package gate

import (
	"cmp"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/utils/clock"
)

// Defaults for InitialEventsConfig.
const (
	// DefaultTurn is the longest a watcher streams its initial
	// events while others wait: long enough for a watch-list of 100,000
	// objects of 1 KiB to finish in one turn (about 2 s on one core), so
	// that watch-lists finish one after another rather than all at the end.
	DefaultTurn = 5 * time.Second
	// DefaultStall is how long a watcher may wait for its
	// client to take one event before its turn ends, if others wait. A
	// client that keeps up takes an event in microseconds; one that waits
	// on its network, or has stopped reading, uses no CPU and so should
	// hold no turn.
	DefaultStall = 100 * time.Millisecond
)

// InitialEvents bounds how many watchers, across every cache built with
// it, stream their initial events at once: watch-lists and watches from
// resourceVersion 0. Streaming a state to a client costs a core per stream
// in the watch handler (encoding, compression, TLS), and on a server with
// few cores a hundred watch-lists at once would take the CPU that writes
// and the watch stream need. The others wait their turn, first come first
// served. A watcher keeps its turn until its initial events are sent; if
// others wait, only until its client has not taken an event for a stall's
// length, or for a turn's length, so that a slow or stalled client holds
// no turn for long. It queues again once its client takes the event.
// Waiting costs the watcher nothing else: it keeps its place in the cache
// and catches up from the event log afterwards.
//
// Upstream bounds the same work through priority and fairness, which
// counts a watch as executing until its initial events are sent; the cache
// tells it so too (utilflowcontrol.WatchInitialized). But priority and
// fairness counts seats, not cores: in aggregated mode behind
// kube-apiserver, with 100 watch-lists of 10,000 objects from a user under
// a priority level of 30 shares, 4 lists of the same objects beside them
// ended in 0.75 s (0.63-0.76) with the gate and 8.73 s (6.55-9.35)
// without it, the last watch-list at 12.0 s against 11.9, the writes'
// p99 beside them 241 ms against 310, ranges overlapping (make
// bench-gates, 3 rounds, docs/benchmarks.md). The gate also holds where
// priority and fairness is off, as in standalone mode, where it halved the
// writes' p99 beside 100 watch-lists, and for requests it exempts.
type InitialEvents struct {
	// slots holds a token per turn being taken. Its senders wait in FIFO
	// order, which makes the gate first come first served.
	slots chan struct{}
	// waiting counts the watchers waiting for a turn.
	waiting atomic.Int32
	turn    time.Duration
	stall   time.Duration
	clock   clock.Clock
}

// InitialEventsConfig configures NewInitialEvents.
type InitialEventsConfig struct {
	// Concurrency is how many watchers stream initial events at once; 0
	// is no bound.
	Concurrency int
	// Turn is the longest a watcher keeps its turn while others wait.
	// Default DefaultTurn.
	Turn time.Duration
	// Stall is how long a watcher keeps its turn, while others wait, when
	// its client does not take an event. Default DefaultStall.
	Stall time.Duration
	// Clock times the turns. Default: the real clock.
	Clock clock.Clock
}

// NewInitialEvents returns a gate for cfg.Concurrency streams at once,
// or nil, which bounds nothing, if cfg.Concurrency is not positive.
func NewInitialEvents(cfg InitialEventsConfig) *InitialEvents {
	if cfg.Concurrency <= 0 {
		return nil
	}
	cfg.Turn = cmp.Or(cfg.Turn, DefaultTurn)
	cfg.Stall = cmp.Or(cfg.Stall, DefaultStall)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &InitialEvents{slots: make(chan struct{}, cfg.Concurrency), turn: cfg.Turn, stall: cfg.Stall, clock: cfg.Clock}
}

// Turn is one watcher's passage through the gate. A nil gate lets every
// watcher through at once.
type Turn struct {
	g       *InitialEvents
	w       Stream
	waiting compbasemetrics.GaugeMetric
	// timer ends the current turn; nil while the watcher holds none.
	timer clock.Timer
	// stall times one send to a client that is not taking events; nil
	// until the first such send.
	stall clock.Timer
}

// Enter waits for a turn for w, or until w stops. waiting counts the
// watchers waiting for one.
func (g *InitialEvents) Enter(w Stream, waiting compbasemetrics.GaugeMetric) (*Turn, bool) {
	t := &Turn{g: g, w: w, waiting: waiting}
	return t, t.acquire()
}

func (t *Turn) acquire() bool {
	if t.g == nil {
		return true
	}
	select {
	case t.g.slots <- struct{}{}:
	default:
		t.waiting.Inc()
		t.g.waiting.Add(1)
		defer func() {
			t.waiting.Dec()
			t.g.waiting.Add(-1)
		}()
		select {
		case t.g.slots <- struct{}{}:
		case <-t.w.Done:
			return false
		}
	}
	t.timer = t.g.clock.NewTimer(t.g.turn)
	return true
}

// renewTurn starts the current turn again, as when nobody waits at its end.
func (t *Turn) renewTurn() {
	t.timer.Reset(t.g.turn)
}

// Leave gives the turn up, if the watcher holds one.
func (t *Turn) Leave() {
	if t.stall != nil {
		t.stall.Stop()
	}
	if t.timer == nil {
		return
	}
	t.timer.Stop()
	t.timer = nil
	<-t.g.slots
}

// stalled returns a channel that fires when a send has waited a stall's
// length for the client.
func (t *Turn) stalled() <-chan time.Time {
	if t.stall == nil {
		t.stall = t.g.clock.NewTimer(t.g.stall)
	} else {
		t.stall.Reset(t.g.stall)
	}
	return t.stall.C()
}

// Send delivers ev to the watcher, or reports false once it stopped,
// within the watcher's turn. When the turn is over the watcher lets the first one waiting go,
// and queues again: at once if its client keeps up, once the client takes
// ev if not. A client that stalls for a stall's length while others wait
// ends the turn the same way, so that it waits for its client without a
// turn.
func (t *Turn) Send(ev watch.Event) bool {
	if t.g == nil {
		return t.w.send(ev)
	}
	select {
	case <-t.timer.C():
		if t.g.waiting.Load() == 0 {
			t.renewTurn()
			break
		}
		t.Leave()
		if !t.acquire() {
			return false
		}
	default:
	}
	select {
	case t.w.Events <- ev:
		return true
	case <-t.w.Done:
		return false
	default:
	}
	stalled := t.stalled()
	for {
		select {
		case t.w.Events <- ev:
			t.stall.Stop()
			return true
		case <-t.w.Done:
			return false
		case <-t.timer.C():
			if t.g.waiting.Load() == 0 {
				t.renewTurn()
				continue
			}
		case <-stalled:
			if t.g.waiting.Load() == 0 {
				stalled = t.stalled()
				continue
			}
		}
		// Others wait: they go first while this client catches up.
		t.Leave()
		return t.w.send(ev) && t.acquire()
	}
}
