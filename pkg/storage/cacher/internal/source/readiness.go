package source

import (
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// State is the cache's life cycle:
//
//	          list done              must re-list
//	Pending ────────────▶ Ready ─────────────────────▶ Pending (relisting)
//	   │                 │ ▲ ▲                            │
//	   │                 │ │ └──────── list done ─────────┘
//	   │                 │ └── etcd watch lost: re-watch from the head, stay Ready
//	   └─────────────────┴──── Stop ────▶ Stopped
//
// The cache must re-list only when etcd compacted its head, an event is
// unreadable, or the consistency check failed; see follower. Reads and
// watches are served only while Ready. Until then they get 429 with
// Retry-After, unless Config.ConsistentReadFallback sends them to etcd.
type State uint8

// The states.
const (
	Pending State = iota
	Ready
	Stopped
)

// Readiness tracks the cache's State and lets callers wait for a change by
// receiving from a channel.
type Readiness struct {
	// mu guards state, beenReady and changed, and serializes unready.
	mu    sync.Mutex
	state State
	// beenReady is set the first time the state is Ready.
	beenReady bool
	changed   chan struct{}
	// unready, if set, is 1 while the state is Pending, else 0.
	unready Gauge
}

// Gauge is a gauge the source sets to a value.
type Gauge interface{ Set(float64) }

// NewReadiness returns a Pending readiness that keeps unready, if set, at
// 1 while Pending and 0 otherwise.
func NewReadiness(unready Gauge) *Readiness {
	r := &Readiness{changed: make(chan struct{}), unready: unready}
	if unready != nil {
		unready.Set(1)
	}
	return r
}

// Set moves to s, unless Stopped.
func (r *Readiness) Set(s State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == Stopped || r.state == s {
		return
	}
	r.state = s
	r.beenReady = r.beenReady || s == Ready
	if r.unready != nil {
		if s == Pending {
			r.unready.Set(1)
		} else {
			r.unready.Set(0)
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// Get returns the state, and a channel closed when it changes.
func (r *Readiness) Get() (State, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state, r.changed
}

// BeenReady reports whether the state has ever been Ready.
func (r *Readiness) BeenReady() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.beenReady
}

// Check returns nil when Ready, or the error a request gets otherwise: 429
// while Pending, 503 once Stopped.
func (r *Readiness) Check(what string) error {
	s, _ := r.Get()
	switch s {
	case Ready:
		return nil
	case Stopped:
		return apierrors.NewServiceUnavailable("the watch cache for " + what + " is stopped")
	default:
		return apierrors.NewTooManyRequests("the watch cache for "+what+" is initializing; retry shortly", 1)
	}
}
