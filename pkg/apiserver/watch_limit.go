package apiserver

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// DefaultMaxWatches is --max-watches' default. An open watch costs this
// server 30 to 55 KiB of RSS when clients share HTTP/2 connections (make
// bench-serve: 30 before it carries an event, 37 to 53 once it has, with
// the garbage its events leave) and about 100 KiB when each has its own
// (make bench-http), so 20,000 watches are 0.6 to 2 GiB: within the
// manifests' 4 GiB beside 100,000 objects (564 MiB) even with a connection
// each, and
// low enough that a runaway client cannot take the server's memory with it
// (docs/operations.md, Sizing).
const DefaultMaxWatches = 20_000

// watchLimitRetryAfter is the Retry-After of a refused watch, in seconds.
const watchLimitRetryAfter = 5

var (
	openWatchesGauge = compbasemetrics.NewGauge(&compbasemetrics.GaugeOpts{
		Namespace: "cached_apiserver", Name: "open_watches",
		Help:           "Watch requests being served, watch-lists included; --max-watches caps them.",
		StabilityLevel: compbasemetrics.ALPHA,
	})
	rejectedWatchesCounter = compbasemetrics.NewCounter(&compbasemetrics.CounterOpts{
		Namespace: "cached_apiserver", Name: "rejected_watches_total",
		Help:           "Watch requests refused with 429 because --max-watches were open.",
		StabilityLevel: compbasemetrics.ALPHA,
	})
	registerWatchLimitMetrics sync.Once
)

// watchLimit caps how many watch requests the server serves at once. A
// watch past the cap gets 429 Too Many Requests with Retry-After before it
// reaches storage; open watches are never touched. Upstream has no such
// cap: it bounds in-flight requests, and counts a watch only until it is
// set up.
type watchLimit struct {
	max        int64
	serializer runtime.NegotiatedSerializer
	// open counts watches being served.
	open atomic.Int64
}

// WithWatchLimit wraps handler, which must run after the request-info
// filter, with a cap of max open watches. max <= 0 is no cap; the gauge of
// open watches is kept either way.
func WithWatchLimit(handler http.Handler, max int, serializer runtime.NegotiatedSerializer) http.Handler {
	registerWatchLimitMetrics.Do(func() {
		legacyregistry.MustRegister(openWatchesGauge, rejectedWatchesCounter)
	})
	l := &watchLimit{max: int64(max), serializer: serializer}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		info, ok := request.RequestInfoFrom(req.Context())
		if !ok || !info.IsResourceRequest || info.Verb != "watch" {
			handler.ServeHTTP(w, req)
			return
		}
		if !l.acquire() {
			rejectedWatchesCounter.Inc()
			err := apierrors.NewTooManyRequests(fmt.Sprintf("this server already serves its limit of %d watches "+
				"(--max-watches); retry later, or through another replica", l.max), watchLimitRetryAfter)
			gv := schema.GroupVersion{Group: info.APIGroup, Version: info.APIVersion}
			responsewriters.ErrorNegotiated(err, l.serializer, gv, w, req)
			return
		}
		serveThen(handler, w, req, l.release)
	})
}

func (l *watchLimit) acquire() bool {
	n := l.open.Add(1)
	if l.max > 0 && n > l.max {
		l.open.Add(-1)
		return false
	}
	openWatchesGauge.Inc()
	return true
}

func (l *watchLimit) release() {
	l.open.Add(-1)
	openWatchesGauge.Dec()
}
