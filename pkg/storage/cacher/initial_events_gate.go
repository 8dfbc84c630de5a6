package cacher

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/utils/clock"
)

// DefaultInitialEventsTurn is how long a watcher streams its initial events
// before one waiting for a turn may go first: long enough for a watch-list
// of 10,000 objects to finish in one turn, short enough that a slow client
// holds the others back by a second at most.
const DefaultInitialEventsTurn = time.Second

// InitialEventsGate bounds how many watchers, across every cache built with
// it, stream their initial events at once: watch-lists and watches from
// resourceVersion 0. Streaming a state to a client costs a core per stream
// in the watch handler (encoding, compression, TLS), and on a server with
// few cores a hundred watch-lists at once would take the CPU that writes
// and the watch stream need. The others wait their turn, first come first
// served; a watcher keeps its turn until its initial events are sent, or
// for a turn's length if others wait, so that a slow or stalled client
// holds no turn for long. Waiting costs the watcher nothing else: it keeps
// its place in the cache and catches up from the event log afterwards.
//
// Upstream bounds the same work through priority and fairness, which
// counts a watch as executing until its initial events are sent; the cache
// tells it so too (utilflowcontrol.WatchInitialized). The gate also holds
// where priority and fairness is off, as in standalone mode, and for
// requests it exempts.
type InitialEventsGate struct {
	// slots holds a token per turn being taken. Its senders wait in FIFO
	// order, which makes the gate first come first served.
	slots chan struct{}
	turn  time.Duration
	clock clock.Clock
}

// InitialEventsGateConfig configures NewInitialEventsGate.
type InitialEventsGateConfig struct {
	// Concurrency is how many watchers stream initial events at once.
	Concurrency int
	// Turn is how long a watcher keeps its turn while others wait. Default
	// DefaultInitialEventsTurn.
	Turn time.Duration
	// Clock times the turns. Default: the real clock.
	Clock clock.Clock
}

// NewInitialEventsGate returns a gate for cfg.Concurrency streams at once.
func NewInitialEventsGate(cfg InitialEventsGateConfig) (*InitialEventsGate, error) {
	if cfg.Concurrency <= 0 {
		return nil, fmt.Errorf("cacher: InitialEventsGateConfig.Concurrency must be positive, not %d", cfg.Concurrency)
	}
	setDefault(&cfg.Turn, DefaultInitialEventsTurn)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &InitialEventsGate{slots: make(chan struct{}, cfg.Concurrency), turn: cfg.Turn, clock: cfg.Clock}, nil
}

// gateTurn is one watcher's passage through the gate. A nil gate lets
// every watcher through at once.
type gateTurn struct {
	g       *InitialEventsGate
	w       *watcher
	waiting compbasemetrics.GaugeMetric
	// timer ends the current turn; nil while the watcher holds none.
	timer clock.Timer
}

// enter waits for a turn for w, or until w stops. waiting counts the
// watchers waiting for one.
func (g *InitialEventsGate) enter(w *watcher, waiting compbasemetrics.GaugeMetric) (*gateTurn, bool) {
	t := &gateTurn{g: g, w: w, waiting: waiting}
	return t, t.acquire()
}

func (t *gateTurn) acquire() bool {
	if t.g == nil {
		return true
	}
	select {
	case t.g.slots <- struct{}{}:
	default:
		t.waiting.Inc()
		defer t.waiting.Dec()
		select {
		case t.g.slots <- struct{}{}:
		case <-t.w.done:
			return false
		}
	}
	t.timer = t.g.clock.NewTimer(t.g.turn)
	return true
}

// leave gives the turn up, if the watcher holds one.
func (t *gateTurn) leave() {
	if t.timer == nil {
		return
	}
	t.timer.Stop()
	t.timer = nil
	<-t.g.slots
}

// send delivers ev to the watcher like watcher.send, within the watcher's
// turn. When the turn is over the watcher lets the first one waiting go,
// and queues again: at once if its consumer keeps up, once the consumer
// takes ev if not, so that a stalled client waits without a turn.
func (t *gateTurn) send(ev watch.Event) bool {
	if t.g == nil {
		return t.w.send(ev)
	}
	select {
	case <-t.timer.C():
		t.leave()
		if !t.acquire() {
			return false
		}
	default:
	}
	select {
	case t.w.ch <- ev:
		return true
	case <-t.w.done:
		return false
	case <-t.timer.C():
		t.leave()
		return t.w.send(ev) && t.acquire()
	}
}
