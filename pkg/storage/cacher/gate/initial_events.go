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
	// DefaultShare is the part of the time a watcher streams
	// its initial events while the foreground is busy: half, which took
	// the p99 of writes at 100/s beside 100 watch-lists of 10,000 objects
	// on 2 cores from 18 to 9.5 ms, 0.12× to 0.064× of upstream's, the
	// last watch-list ending with upstream's (docs/benchmarks.md, "What
	// each mechanism buys").
	DefaultShare = 0.5
	// DefaultSlice is how long a watcher streams, while the
	// foreground is busy, before it pauses for the rest of its share:
	// short, so that a request that arrives while it streams shares the
	// CPU for little of its time.
	DefaultSlice = 2 * time.Millisecond
	// DefaultYield is the most a watcher may owe, in pauses
	// for requests in flight, to its streaming: enough to wait out a few
	// writes of about 5 ms each.
	DefaultYield = 20 * time.Millisecond
)

// Foreground tells the gate whether requests that clients wait on, such
// as writes, are being served. The server knows; the cache does not.
type Foreground interface {
	// Busy reports whether such a request is in flight or ended a moment
	// ago.
	Busy() bool
	// InFlight returns nil while no such request is in flight, or else a
	// channel that is closed once none is.
	InFlight() <-chan struct{}
}

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
// While the server serves requests that clients wait on (Foreground), a
// watcher in its turn also paces itself: it streams for a slice, then
// pauses for as long as keeps its streaming to a share of the time. On
// two cores, one stream at a time, with the client reading it and etcd,
// still doubled the writes' p99; the pauses leave the CPU they need.
// Pauses on a clock fall where they fall, though, and a write that
// arrives in a slice shares the CPU with the stream for the slice's rest.
// So a watcher also yields to requests in flight: it stops streaming when
// one is, and resumes once none is. It earns the time it may yield by
// streaming, in the proportion of its share, so that constant requests
// slow the stream to its share but do not stop it.
//
// Upstream bounds the same work through priority and fairness, which
// counts a watch as executing until its initial events are sent; the cache
// tells it so too (utilflowcontrol.WatchInitialized). The gate also holds
// where priority and fairness is off, as in standalone mode, and for
// requests it exempts.
type InitialEvents struct {
	// slots holds a token per turn being taken. Its senders wait in FIFO
	// order, which makes the gate first come first served.
	slots chan struct{}
	// waiting counts the watchers waiting for a turn.
	waiting atomic.Int32
	turn    time.Duration
	stall   time.Duration
	fg      Foreground
	slice   time.Duration
	// pause follows each slice while fg is busy; zero never pauses.
	pause time.Duration
	// rate is the time a watcher earns to yield per unit of time it streams,
	// and yield the most it may hold.
	rate  float64
	yield time.Duration
	clock clock.Clock
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
	// Foreground, if set, paces the streams while it is busy: after each
	// Slice of streaming, a watcher pauses for as long as makes its time
	// streaming Share of the whole, so that requests the foreground serves
	// find CPU free. Nil never paces.
	Foreground Foreground
	// Share is the part of the time a watcher streams while the
	// foreground is busy, above 0; 1 or more never pauses. Default
	// DefaultShare.
	Share float64
	// Slice is how long a watcher streams before it pauses. Default
	// DefaultSlice.
	Slice time.Duration
	// Yield is the most time a watcher may hold for yielding to requests
	// in flight, which it earns at (1-Share)/Share of its streaming time.
	// Default DefaultYield.
	Yield time.Duration
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
	cfg.Share = cmp.Or(cfg.Share, DefaultShare)
	cfg.Slice = cmp.Or(cfg.Slice, DefaultSlice)
	cfg.Yield = cmp.Or(cfg.Yield, DefaultYield)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	g := &InitialEvents{slots: make(chan struct{}, cfg.Concurrency), turn: cfg.Turn, stall: cfg.Stall,
		fg: cfg.Foreground, slice: cfg.Slice, yield: cfg.Yield, clock: cfg.Clock}
	if cfg.Share < 1 {
		g.rate = (1 - cfg.Share) / cfg.Share
		// A slice's pause, not one as long as the time since the slice
		// began, which may hold a wait for the client that took no CPU.
		g.pause = time.Duration(float64(cfg.Slice) * g.rate)
	}
	return g
}

// Turn is one watcher's passage through the gate. A nil gate lets every
// watcher through at once.
type Turn struct {
	g       *InitialEvents
	w       Stream
	waiting compbasemetrics.GaugeMetric
	// paused counts the seconds the watcher pauses for the foreground.
	paused compbasemetrics.CounterMetric
	// timer ends the current turn, at turnEnd; nil while the watcher
	// holds none.
	timer   clock.Timer
	turnEnd time.Time
	// stall times one send to a client that is not taking events; nil
	// until the first such send.
	stall clock.Timer
	// sliceStart is when the watcher last began to stream; zero until its
	// first event in a turn.
	sliceStart time.Time
	// credit is the time the watcher may yet yield to requests in
	// flight, earned by streaming.
	credit time.Duration
}

// Enter waits for a turn for w, or until w stops. waiting counts the
// watchers waiting for one, paused the seconds w pauses in its turns.
func (g *InitialEvents) Enter(w Stream, waiting compbasemetrics.GaugeMetric, paused compbasemetrics.CounterMetric) (*Turn, bool) {
	t := &Turn{g: g, w: w, waiting: waiting, paused: paused}
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
	t.turnEnd = t.g.clock.Now().Add(t.g.turn)
	t.sliceStart = time.Time{}
	return true
}

// renewTurn starts the current turn again, as when nobody waits at its end.
func (t *Turn) renewTurn() {
	t.turnEnd = t.g.clock.Now().Add(t.g.turn)
	t.timer.Reset(t.g.turn)
}

// extendTurn moves the end of the current turn by d, the length of a
// pause: a paused watcher uses no CPU, which is what turns share out.
// Otherwise a watch-list that needs about a turn of streaming, paced to
// half the time, would end its turn just before its end, and queue
// behind every other.
func (t *Turn) extendTurn(d time.Duration) {
	if !t.timer.Stop() {
		// It fired during the pause; its value, if any, is stale.
		select {
		case <-t.timer.C():
		default:
		}
	}
	t.turnEnd = t.turnEnd.Add(d)
	t.timer.Reset(t.turnEnd.Sub(t.g.clock.Now()))
}

// minRun is the least a watcher streams between two yields: a few events'
// worth, so that each yield buys some progress.
const minRun = 100 * time.Microsecond

// pace pauses the watcher while the foreground is busy: while requests are
// in flight, for as long as its credit lasts, and once it has streamed for
// a slice, for as long as keeps its streaming to its share of the time. It
// reports false if the watcher stopped meanwhile.
func (t *Turn) pace() bool {
	if t.g.fg == nil || t.g.pause == 0 {
		return true
	}
	now := t.g.clock.Now()
	if t.sliceStart.IsZero() {
		t.sliceStart = now
		return true
	}
	ran := now.Sub(t.sliceStart)
	if ran < minRun {
		return true
	}
	if inFlight := t.g.fg.InFlight(); inFlight != nil {
		t.earn(ran)
		if t.credit > 0 {
			return t.pauseFor(now, inFlight, t.credit, true)
		}
		t.sliceStart = now
		return true
	}
	if ran < t.g.slice {
		return true
	}
	t.earn(ran)
	if !t.g.fg.Busy() {
		t.sliceStart = now
		return true
	}
	return t.pauseFor(now, nil, t.g.pause, false)
}

// earn credits the watcher for ran of streaming.
func (t *Turn) earn(ran time.Duration) {
	t.credit = min(t.credit+time.Duration(float64(ran)*t.g.rate), t.g.yield)
}

// pauseFor pauses the watcher for d, or until until is closed, from now.
// A yield spends the watcher's credit.
func (t *Turn) pauseFor(now time.Time, until <-chan struct{}, d time.Duration, yield bool) bool {
	pause := t.g.clock.NewTimer(d)
	defer pause.Stop()
	select {
	case <-pause.C():
	case <-until:
	case <-t.w.Done:
		return false
	}
	t.sliceStart = t.g.clock.Now()
	paused := t.sliceStart.Sub(now)
	if yield {
		t.credit -= paused
	}
	t.paused.Add(paused.Seconds())
	t.extendTurn(paused)
	return true
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
	if !t.pace() {
		return false
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
