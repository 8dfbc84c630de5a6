package cacher

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Initialized tells whether every cache built with it has been ready at
// least once: a server's /readyz check (Check), which holds the server
// unready for as long as a cache's first list takes.
//
// The generic server's storage-readiness hook gives up waiting for the
// caches after --storage-initialization-timeout (1 minute) and lets
// /readyz pass. Upstream's Cacher serves reads from etcd until it is
// ready, so that is safe there; ours answers 429 (unless
// Config.ConsistentReadFallback), so a server declared ready then would
// refuse every read: at a million objects the first list took 77 s
// (issue 66), and a rolling update would take the next old replica down
// while the new one refused reads. A cache that re-lists later does not
// make the server unready again: its clients keep their state and retry.
// A cache with Config.ConsistentReadFallback is not waited for: it reads
// from etcd until ready, as upstream's does. A cache whose first list
// never succeeds keeps the server unready, and Check names it.
type Initialized struct {
	// mu guards pending.
	mu sync.Mutex
	// pending are the caches that have not been ready yet.
	pending map[*Cacher]struct{}
}

// NewInitialized returns an Initialized with no cache.
func NewInitialized() *Initialized { return &Initialized{pending: map[*Cacher]struct{}{}} }

// register adds a cache that has not been ready yet.
func (i *Initialized) register(c *Cacher) {
	if i == nil {
		return
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.pending[c] = struct{}{}
}

// unregister forgets a stopped cache.
func (i *Initialized) unregister(c *Cacher) {
	if i == nil {
		return
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	delete(i.pending, c)
}

// Check returns nil once every cache registered has been ready, or an
// error naming the resources whose caches have not.
func (i *Initialized) Check() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	var waiting []string
	for c := range i.pending {
		if c.ready.BeenReady() {
			delete(i.pending, c)
			continue
		}
		waiting = append(waiting, c.what())
	}
	if len(waiting) == 0 {
		return nil
	}
	slices.Sort(waiting)
	return fmt.Errorf("the watch caches of %s have not listed yet", strings.Join(waiting, ", "))
}
