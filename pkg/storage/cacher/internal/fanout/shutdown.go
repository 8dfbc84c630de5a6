package fanout

import (
	"context"
	"sync"
	"time"
)

// shutdownDrainPoll is how often Begin looks at the bookmarked watchers'
// channels.
const shutdownDrainPoll = 5 * time.Millisecond

// Shutdown tells every cache built with it that its server is about to end
// every watch. A server calls Begin in a pre-shutdown hook: the generic
// server ends watches as soon as its hooks return, so Begin returns only
// once each watcher that accepts bookmarks has taken one at the head from
// its channel, and each watcher registered after gets one too. No watch
// then ends having delivered nothing: client-go's reflector re-lists after
// a watch that ends within a second with no event, and resumes from a
// fresher resourceVersion after a bookmark.
type Shutdown struct {
	// mu guards caches and begun.
	mu     sync.Mutex
	caches map[*Dispatcher]struct{}
	begun  bool
}

// NewShutdown returns a Shutdown that has not begun.
func NewShutdown() *Shutdown { return &Shutdown{caches: map[*Dispatcher]struct{}{}} }

// Begin bookmarks every watcher of every cache and waits, until ctx ends,
// for them to take their bookmarks.
func (s *Shutdown) Begin(ctx context.Context) {
	s.mu.Lock()
	s.begun = true
	caches := make([]*Dispatcher, 0, len(s.caches))
	for d := range s.caches {
		caches = append(caches, d)
	}
	s.mu.Unlock()
	var pending []*Watcher
	for _, d := range caches {
		pending = append(pending, d.beginShutdown()...)
	}
	t := time.NewTicker(shutdownDrainPoll)
	defer t.Stop()
	for len(pending) > 0 {
		// A watcher that took the bookmark, or ended, is done.
		left := pending[:0]
		for _, w := range pending {
			if !w.drained() {
				left = append(left, w)
			}
		}
		pending = left
		if len(pending) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Register adds a cache; one registered after Begin begins at once.
func (s *Shutdown) Register(d *Dispatcher) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.caches[d] = struct{}{}
	begun := s.begun
	s.mu.Unlock()
	if begun {
		d.beginShutdown()
	}
}

func (s *Shutdown) Unregister(d *Dispatcher) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.caches, d)
}
