package apiserver

import (
	"net/http"
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
// initial events it streams while it is busy (cacher.Foreground), so that
// a hundred watch-lists do not take the CPU that writes need.
type Foreground struct {
	linger time.Duration
	clock  clock.PassiveClock
	// inFlight counts the requests being served.
	inFlight atomic.Int64
	// lastEnd is when the last request ended, in Unix nanoseconds.
	lastEnd atomic.Int64
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

// Busy implements cacher.Foreground.
func (f *Foreground) Busy() bool {
	if f.inFlight.Load() > 0 {
		return true
	}
	end := f.lastEnd.Load()
	return end != 0 && f.clock.Since(time.Unix(0, end)) < f.linger
}

// WithForeground wraps handler, which must run after the request-info
// filter, so that f counts the resource requests it serves that are not
// long-running. Others, such as health checks and metrics, do not count:
// they come on a schedule, not from a client's work.
func WithForeground(handler http.Handler, f *Foreground, longRunning request.LongRunningRequestCheck) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		info, ok := request.RequestInfoFrom(req.Context())
		if !ok || !info.IsResourceRequest || (longRunning != nil && longRunning(req, info)) {
			handler.ServeHTTP(w, req)
			return
		}
		f.inFlight.Add(1)
		defer func() {
			f.lastEnd.Store(f.clock.Now().UnixNano())
			f.inFlight.Add(-1)
		}()
		handler.ServeHTTP(w, req)
	})
}
