package apiserver

import (
	"context"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeCA is a CA provider whose content the test sets, notifying listeners
// as the ConfigMap controllers do.
type fakeCA struct {
	// mu guards content and listeners.
	mu        sync.Mutex
	content   []byte
	listeners []dynamiccertificates.Listener
}

func (f *fakeCA) Name() string { return "fake" }
func (f *fakeCA) CurrentCABundleContent() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.content
}
func (f *fakeCA) VerifyOptions() (x509.VerifyOptions, bool) { return x509.VerifyOptions{}, false }
func (f *fakeCA) AddListener(l dynamiccertificates.Listener) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listeners = append(f.listeners, l)
}
func (f *fakeCA) load() {
	f.mu.Lock()
	f.content = []byte("a CA")
	listeners := f.listeners
	f.mu.Unlock()
	for _, l := range listeners {
		l.Enqueue()
	}
}

func TestAuthenticationReady(t *testing.T) {
	for _, tc := range []struct {
		name string
		// loaded: the CA has content before the request.
		loaded bool
		path   string
		// then happens while the request waits.
		then     func(ca *fakeCA, clock *clocktesting.FakeClock, cancel func())
		wantCode int // 0: the request ended with no response (client gone)
		// wantReady is Ready() after the request.
		wantReady bool
	}{
		{name: "loaded", loaded: true, path: "/apis", wantCode: http.StatusOK, wantReady: true},
		{name: "health checks never wait", path: "/readyz", wantCode: http.StatusOK},
		{name: "health sub-checks never wait", path: "/livez/ping", wantCode: http.StatusOK},
		{name: "waits until loaded", path: "/apis",
			then:     func(ca *fakeCA, _ *clocktesting.FakeClock, _ func()) { ca.load() },
			wantCode: http.StatusOK, wantReady: true},
		{name: "503 with Retry-After when never loaded", path: "/apis",
			then: func(_ *fakeCA, clock *clocktesting.FakeClock, _ func()) {
				clock.Step(DefaultAuthenticationWait)
			},
			wantCode: http.StatusServiceUnavailable},
		{name: "client gone", path: "/apis",
			then:     func(_ *fakeCA, _ *clocktesting.FakeClock, cancel func()) { cancel() },
			wantCode: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := &fakeCA{}
			if tc.loaded {
				ca.load()
			}
			clock := clocktesting.NewFakeClock(time.Now())
			a := NewAuthenticationReady(AuthenticationReadyConfig{CA: ca, Clock: clock, Serializer: Codecs})
			served := make(chan struct{}, 1)
			handler := a.WithAuthenticationReady(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				served <- struct{}{}
				w.WriteHeader(http.StatusOK)
			}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptest.NewRequest(http.MethodGet, tc.path, nil).WithContext(ctx)
			rec := httptest.NewRecorder()
			done := make(chan struct{})
			go func() {
				defer close(done)
				handler.ServeHTTP(rec, req)
			}()
			if tc.then != nil {
				// Act only once the request waits on the clock.
				for !clock.HasWaiters() {
					select {
					case <-done:
						t.Fatalf("the request did not wait: HTTP %d", rec.Code)
					case <-time.After(time.Millisecond):
					}
				}
				tc.then(ca, clock, cancel)
			}
			<-done
			gotCode := rec.Code
			if tc.wantCode == 0 {
				if len(served) != 0 || rec.Body.Len() != 0 {
					t.Fatalf("a request whose client left was served or answered: HTTP %d %q", rec.Code, rec.Body)
				}
			} else if gotCode != tc.wantCode {
				t.Fatalf("HTTP %d %s, want %d", gotCode, rec.Body, tc.wantCode)
			}
			if tc.wantCode == http.StatusServiceUnavailable {
				if got := rec.Header().Get("Retry-After"); got != "1" {
					t.Errorf("Retry-After %q, want 1", got)
				}
				if len(served) != 0 {
					t.Errorf("the request reached the handler")
				}
			}
			if a.Ready() != tc.wantReady {
				t.Errorf("Ready() = %v, want %v", a.Ready(), tc.wantReady)
			}
			if err := a.Check().Check(nil); (err == nil) != tc.wantReady {
				t.Errorf("readyz check: %v, want ready %v", err, tc.wantReady)
			}
		})
	}
}

func TestAuthenticationReadyWithoutCA(t *testing.T) {
	a := NewAuthenticationReady(AuthenticationReadyConfig{Serializer: Codecs})
	if !a.Ready() {
		t.Fatal("with no CA to load, the server must be ready")
	}
}
