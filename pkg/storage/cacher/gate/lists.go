package gate

import (
	"cmp"
	"context"
	"sync"
	"time"

	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/utils/clock"
)

// Defaults for ListsConfig.
const (
	// DefaultListMinItems is the size from which a list goes through
	// the gate: it takes the handler tens of milliseconds or more to
	// encode, and a list that copies its items (not a SharingList) holds
	// 3-4 MB of them, about 350 bytes an Assignment whatever its payload.
	DefaultListMinItems = 10_000
	// DefaultListHold is the longest a list keeps its place: a list of
	// 100,000 objects of 1 KiB is written in about 2 s. A client that reads
	// slower than that, or a caller whose context never ends, delays the
	// lists behind it by at most this.
	DefaultListHold = 10 * time.Second
)

// Lists bounds how many large lists, across every cache built with it,
// are served at once. Writing a list's response takes a core (encoding,
// compression, TLS): lists beyond the cores only wait for CPU, holding
// their items meanwhile. A SharingList holds 16 bytes an item; a list at
// another version converts each object and holds the copies until its
// response is written. On two cores, two at a time read 32 lists of
// 100,000 objects 13% sooner than all at once, and 8 lists at another
// version added 2% to the RSS instead of 13% (docs/benchmarks.md, "What
// each mechanism buys"). The others wait, first come first served,
// having matched their objects but before taking them; a list keeps its
// place until its request ends (its context is done), or for a hold's
// length.
//
// Upstream bounds lists through priority and fairness, which counts a list
// of many objects as several seats but does not bound their memory; the
// gate also holds where priority and fairness is off, as in standalone
// mode, and for requests it exempts.
type Lists struct {
	// slots holds a token per list in the gate. Its senders wait in FIFO
	// order, which makes the gate first come first served.
	slots    chan struct{}
	minItems int
	hold     time.Duration
	clock    clock.WithDelayedExecution
}

// ListsConfig configures NewLists.
type ListsConfig struct {
	// Concurrency is how many large lists are served at once; 0 is
	// no bound.
	Concurrency int
	// MinItems is the size from which a list goes through the gate.
	// Default DefaultListMinItems.
	MinItems int
	// Hold is the longest a list keeps its place. Default DefaultListHold.
	Hold time.Duration
	// Clock times the holds. Default: the real clock.
	Clock clock.WithDelayedExecution
}

// NewLists returns a gate for cfg.Concurrency large lists at once, or
// nil, which bounds nothing, if cfg.Concurrency is not positive.
func NewLists(cfg ListsConfig) *Lists {
	if cfg.Concurrency <= 0 {
		return nil
	}
	cfg.MinItems = cmp.Or(cfg.MinItems, DefaultListMinItems)
	cfg.Hold = cmp.Or(cfg.Hold, DefaultListHold)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Lists{slots: make(chan struct{}, cfg.Concurrency), minItems: cfg.MinItems, hold: cfg.Hold, clock: cfg.Clock}
}

// Enter waits for a place for a list of items, unless it is small, or
// until ctx ends. The list keeps its place until ctx ends, which for a
// request is when its response was written, or for a hold's length.
// waiting counts the lists waiting for one.
func (g *Lists) Enter(ctx context.Context, items int, waiting compbasemetrics.GaugeMetric) error {
	if g == nil || items < g.minItems {
		return nil
	}
	select {
	case g.slots <- struct{}{}:
	default:
		waiting.Inc()
		defer waiting.Dec()
		select {
		case g.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var once sync.Once
	release := func() { once.Do(func() { <-g.slots }) }
	held := g.clock.AfterFunc(g.hold, release)
	context.AfterFunc(ctx, func() {
		held.Stop()
		release()
	})
	return nil
}
