package apiserver

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/utils/clock"
)

// DefaultAuthenticationWait is how long a request waits for the server's
// client CAs before it gets 503.
const DefaultAuthenticationWait = 10 * time.Second

// AuthenticationReady holds requests until the CA the server authenticates
// them with has content.
//
// Behind a kube-apiserver, the front-proxy CA (and the client CA) come from
// the extension-apiserver-authentication ConfigMap through an informer that
// starts with the secure listener. Upstream serves in the meantime with an
// empty CA, by design ("better to have nothing for a brief time"), so for
// about 100 ms after a start every request the aggregator proxies is
// system:anonymous and gets 403, after /readyz already said ready. Measured
// in test/integration's control plane: 8 to 11 403s per restart for a client
// listing every 10 ms, enough for an informer to end its watch and re-list.
// Here such a request waits for the CA instead, and /readyz fails until it
// is loaded.
type AuthenticationReady struct {
	// ca authenticates requests: the front-proxy CA where request headers
	// are accepted, else the client CA.
	ca         dynamiccertificates.CAContentProvider
	wait       time.Duration
	clock      clock.WithTicker
	serializer runtime.NegotiatedSerializer

	// once guards closing ready.
	once  sync.Once
	ready chan struct{}
}

// AuthenticationReadyConfig is what NewAuthenticationReady needs.
type AuthenticationReadyConfig struct {
	// CA is the CA to wait for; nil is always ready.
	CA dynamiccertificates.CAContentProvider
	// Wait bounds how long a request waits; 0 is DefaultAuthenticationWait.
	Wait time.Duration
	// Clock is the clock the wait is timed with; nil is the real one.
	Clock clock.WithTicker
	// Serializer writes the 503.
	Serializer runtime.NegotiatedSerializer
}

// NewAuthenticationReady watches cfg.CA for content.
func NewAuthenticationReady(cfg AuthenticationReadyConfig) *AuthenticationReady {
	a := &AuthenticationReady{ca: cfg.CA, wait: cfg.Wait, clock: cfg.Clock, serializer: cfg.Serializer,
		ready: make(chan struct{})}
	if a.wait <= 0 {
		a.wait = DefaultAuthenticationWait
	}
	if a.clock == nil {
		a.clock = clock.RealClock{}
	}
	if a.ca == nil {
		a.once.Do(func() { close(a.ready) })
		return a
	}
	a.ca.AddListener(a)
	a.Enqueue()
	return a
}

// Enqueue is called by the CA's controller when its content changes.
func (a *AuthenticationReady) Enqueue() {
	if len(a.ca.CurrentCABundleContent()) > 0 {
		a.once.Do(func() { close(a.ready) })
	}
}

// Ready reports whether the CA has content.
func (a *AuthenticationReady) Ready() bool {
	select {
	case <-a.ready:
		return true
	default:
		return false
	}
}

// Check is a /readyz check that fails until the CA has content.
func (a *AuthenticationReady) Check() healthz.HealthChecker {
	return healthz.NamedCheck("authentication-ca", func(*http.Request) error {
		if !a.Ready() {
			return errors.New("the client CAs (extension-apiserver-authentication ConfigMap) are not loaded yet")
		}
		return nil
	})
}

// WithAuthenticationReady wraps handler, outside authentication, so that
// requests wait until the CA has content. Health checks never wait.
func (a *AuthenticationReady) WithAuthenticationReady(handler http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if a.Ready() || isHealthPath(req.URL.Path) {
			handler.ServeHTTP(w, req)
			return
		}
		timer := a.clock.NewTimer(a.wait)
		defer timer.Stop()
		select {
		case <-a.ready:
			handler.ServeHTTP(w, req)
		case <-req.Context().Done():
		case <-timer.C():
			err := &apierrors.StatusError{ErrStatus: metav1.Status{
				Status: metav1.StatusFailure,
				Code:   http.StatusServiceUnavailable,
				Reason: metav1.StatusReasonServiceUnavailable,
				Message: "this server has not loaded the client CAs it authenticates requests with yet (the " +
					"extension-apiserver-authentication ConfigMap in kube-system); retry, and if it lasts check that " +
					"its ServiceAccount may read that ConfigMap",
				Details: &metav1.StatusDetails{RetryAfterSeconds: 1},
			}}
			responsewriters.ErrorNegotiated(err, a.serializer, schema.GroupVersion{}, w, req)
		}
	})
}

func isHealthPath(path string) bool {
	for _, p := range []string{"/healthz", "/livez", "/readyz"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}
