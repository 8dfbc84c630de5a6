package cacher

import (
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// readyState is the cache's life cycle:
//
//	          list done              must re-list
//	Pending ────────────▶ Ready ─────────────────────▶ Pending (relisting)
//	   │                 │ ▲ ▲                            │
//	   │                 │ │ └──────── list done ─────────┘
//	   │                 │ └── etcd watch lost: re-watch from the head, stay Ready
//	   └─────────────────┴──── Stop ────▶ Stopped
//
// The cache must re-list only when etcd compacted its head, an event is
// unreadable, or the consistency check failed; see internal/source. Reads and
// watches are served only while Ready. Until then they get 429 with
// Retry-After, unless Config.ConsistentReadFallback sends them to etcd.
type readyState uint8

const (
	pending readyState = iota
	ready
	stoppedState
)

// readiness tracks readyState and lets callers wait for a change by
// receiving from a channel.
type readiness struct {
	// mu guards state and changed, and serializes unready.
	mu      sync.Mutex
	state   readyState
	changed chan struct{}
	// unready, if set, is 1 while the state is pending, else 0.
	unready *gaugeShare
}

func newReadiness() *readiness { return &readiness{changed: make(chan struct{})} }

func (r *readiness) set(s readyState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == stoppedState || r.state == s {
		return
	}
	r.state = s
	if r.unready != nil {
		if s == pending {
			r.unready.Set(1)
		} else {
			r.unready.Set(0)
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *readiness) get() (readyState, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state, r.changed
}

// check returns nil when ready, or the 429 a request gets otherwise.
func (r *readiness) check(what string) error {
	s, _ := r.get()
	switch s {
	case ready:
		return nil
	case stoppedState:
		return apierrors.NewServiceUnavailable("the watch cache for " + what + " is stopped")
	default:
		return apierrors.NewTooManyRequests("the watch cache for "+what+" is initializing; retry shortly", 1)
	}
}
