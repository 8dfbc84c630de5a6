package apiserver

import (
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/utils/clock"
)

// shutdownRetryAfter is the Retry-After, in seconds, of a request refused
// because the server is shutting down. Upstream's filter says 5
// (k8s.io/apiserver/pkg/server/filters, WithRetryAfter). A client that
// gets it has just been cut off by a SIGTERM and is reconnecting: its
// retry opens a new connection, which reaches another replica, or this
// one once restarted, so waiting 5 s only delays every watch that resumes
// through a stopping replica (3.4–3.8 s of recovery in the fault suite's
// restarts, docs/reliability.md). 1 s is client-go's own retry for a
// connection lost mid-request.
const shutdownRetryAfter = 1

// ShutdownRetryAfterConfig configures WithShutdownRetryAfter.
type ShutdownRetryAfterConfig struct {
	// Initiated is closed when the server starts to shut down
	// (genericapiserver.Config.ShutdownInitiatedNotify).
	Initiated <-chan struct{}
	// Delay is --shutdown-delay-duration: requests are served as usual
	// for that long after Initiated, as the generic server does.
	Delay      time.Duration
	Serializer runtime.NegotiatedSerializer
	Clock      clock.Clock
}

// WithShutdownRetryAfter answers every request that arrives once the
// server has shut down for cfg.Delay with 429 Too Many Requests, a
// Status, Retry-After: 1 and Connection: close, so that the client
// retries soon on a new connection: what --shutdown-send-retry-after makes
// the generic chain answer, with a shorter wait. It must wrap the generic
// chain, so that it answers before the generic filter does. Health checks
// and metrics are served to the end, and the loopback client too, as
// upstream's filter exempts them.
func WithShutdownRetryAfter(handler http.Handler, cfg ShutdownRetryAfterConfig) http.Handler {
	notAccepting := make(chan struct{})
	go func() {
		<-cfg.Initiated
		<-cfg.Clock.After(cfg.Delay)
		close(notAccepting)
	}()
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-notAccepting:
		default:
			handler.ServeHTTP(w, req)
			return
		}
		if exemptFromShutdownRetryAfter(req) {
			handler.ServeHTTP(w, req)
			return
		}
		// Over HTTP/2 the server sends GOAWAY for it, as for the generic filter.
		w.Header().Set("Connection", "close")
		err := apierrors.NewTooManyRequests("the server is shutting down; retry, which reaches another replica "+
			"or this one restarted", shutdownRetryAfter)
		responsewriters.ErrorNegotiated(err, cfg.Serializer, schema.GroupVersion{}, w, req)
	})
}

// exemptFromShutdownRetryAfter reports whether req is served to the end of
// a shutdown: the requests upstream's filter exempts.
func exemptFromShutdownRetryAfter(req *http.Request) bool {
	if strings.HasPrefix(req.UserAgent(), "kube-apiserver/") {
		return true
	}
	for _, p := range []string{"/readyz", "/livez", "/healthz", "/metrics"} {
		if strings.HasPrefix(req.URL.Path, p) {
			return true
		}
	}
	return false
}
