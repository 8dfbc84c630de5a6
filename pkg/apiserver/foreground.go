package apiserver

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/utils/clock"
)

// DefaultForegroundLinger is how long the foreground stays busy after its
// last request ended: a little longer than the gap between writes at
// 100/s, so that a steady stream of requests keeps it busy between them.
const DefaultForegroundLinger = 100 * time.Millisecond

// Foreground tracks the resource requests that clients wait on: every one
// but the long-running (watches, proxies, exec). The watch cache paces the
// initial events it streams while it is busy (gate.Foreground), so that
// a hundred watch-lists do not take the CPU that writes need.
type Foreground struct {
	linger time.Duration
	clock  clock.PassiveClock
	// inFlight counts the requests being served. It changes under mu, with
	// idle, and is read without it.
	inFlight atomic.Int64
	// lastEnd is when the last request ended, in Unix nanoseconds.
	lastEnd atomic.Int64

	// mu guards idle and changes to inFlight.
	mu sync.Mutex
	// idle is closed when the last request in flight ends; nil while none
	// is in flight.
	idle chan struct{}
}

// NewForeground returns a Foreground that stays busy for linger after its
// last request, on clk; zero values take DefaultForegroundLinger and the
// real clock.
func NewForeground(linger time.Duration, clk clock.PassiveClock) *Foreground {
	if linger == 0 {
		linger = DefaultForegroundLinger
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Foreground{linger: linger, clock: clk}
}

// Busy implements gate.Foreground.
func (f *Foreground) Busy() bool {
	if f.inFlight.Load() > 0 {
		return true
	}
	end := f.lastEnd.Load()
	return end != 0 && f.clock.Since(time.Unix(0, end)) < f.linger
}

// InFlight implements gate.Foreground.
func (f *Foreground) InFlight() <-chan struct{} {
	if f.inFlight.Load() == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.idle
}

func (f *Foreground) start() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inFlight.Add(1) == 1 {
		f.idle = make(chan struct{})
	}
}

func (f *Foreground) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastEnd.Store(f.clock.Now().UnixNano())
	if f.inFlight.Add(-1) == 0 {
		close(f.idle)
		f.idle = nil
	}
}

// WithForeground wraps handler so that f counts the resource requests it
// serves that are not long-running. Others, such as health checks and
// metrics, do not count: they come on a schedule, not from a client's
// work. It resolves the request's info itself, so that it can wrap the
// whole handler chain: a request counts from its first filter, since
// authenticating and authorizing it take CPU too.
func WithForeground(handler http.Handler, f *Foreground, infos request.RequestInfoResolver, longRunning request.LongRunningRequestCheck) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		info, err := infos.NewRequestInfo(req)
		if err != nil || !info.IsResourceRequest || (longRunning != nil && longRunning(req, info)) {
			handler.ServeHTTP(w, req)
			return
		}
		f.start()
		defer f.end()
		handler.ServeHTTP(w, req)
	})
}
