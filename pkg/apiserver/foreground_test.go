package apiserver

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	testingclock "k8s.io/utils/clock/testing"
)

func TestForeground(t *testing.T) {
	const base = "/apis/fleet.example.com/v1beta1/namespaces/ns/assignments"
	longRunning := genericfilters.BasicLongRunningRequestCheck(sets.NewString("watch"), sets.NewString())
	infos := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	for _, tc := range []struct {
		name, method, url string
		// counts is whether the request keeps the foreground busy.
		counts bool
	}{
		{name: "a write", method: http.MethodPost, url: base, counts: true},
		{name: "a get", method: http.MethodGet, url: base + "/a", counts: true},
		{name: "a list", method: http.MethodGet, url: base, counts: true},
		// A watch streams for as long as its client keeps it: pacing
		// initial events for it would pace them for good.
		{name: "a watch", method: http.MethodGet, url: base + "?watch=true"},
		// Probes and scrapes come on a schedule, not from a client's work.
		{name: "a health check", method: http.MethodGet, url: "/healthz"},
		{name: "a metrics scrape", method: http.MethodGet, url: "/metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := testingclock.NewFakeClock(time.Unix(1000, 0))
			f := NewForeground(time.Second, clk)
			if f.Busy() {
				t.Fatal("busy before any request")
			}
			if f.InFlight() != nil {
				t.Fatal("a request in flight before any request")
			}
			inHandler, release := make(chan bool), make(chan struct{})
			var idle <-chan struct{}
			// No request-info filter before it: the foreground resolves
			// the request's info itself, to count from the chain's start.
			h := WithForeground(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				idle = f.InFlight()
				inHandler <- f.Busy()
				<-release
			}), f, infos, longRunning)
			req := httptest.NewRequest(tc.method, tc.url, nil)
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			if busy := <-inHandler; busy != tc.counts {
				t.Errorf("busy while the request is served: %v, want %v", busy, tc.counts)
			}
			if (idle != nil) != tc.counts {
				t.Errorf("in flight while the request is served: %v, want %v", idle != nil, tc.counts)
			}
			if idle != nil && isClosed(idle) {
				t.Error("the in-flight channel is closed while the request is served")
			}
			clk.Step(time.Hour) // a request in flight is busy however long it takes
			if busy := f.Busy(); busy != tc.counts {
				t.Errorf("busy an hour into the request: %v, want %v", busy, tc.counts)
			}
			close(release)
			<-done
			if f.InFlight() != nil {
				t.Error("a request in flight after the request ended")
			}
			if idle != nil && !isClosed(idle) {
				t.Error("the in-flight channel is open after the request ended")
			}
			clk.Step(time.Second - time.Nanosecond)
			if busy := f.Busy(); busy != tc.counts {
				t.Errorf("busy just before the linger ends: %v, want %v", busy, tc.counts)
			}
			clk.Step(time.Nanosecond)
			if f.Busy() {
				t.Error("busy once the linger after the request ended")
			}
		})
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestForegroundInFlight checks that the in-flight channel closes when the
// last of overlapping requests ends, not the first.
func TestForegroundInFlight(t *testing.T) {
	f := NewForeground(time.Second, testingclock.NewFakeClock(time.Unix(1000, 0)))
	f.start()
	first := f.InFlight()
	f.start()
	if second := f.InFlight(); second != first {
		t.Error("a second request in flight made a new channel")
	}
	f.end()
	if isClosed(first) || f.InFlight() == nil {
		t.Fatal("the channel closed while a request is still in flight")
	}
	f.end()
	if !isClosed(first) || f.InFlight() != nil {
		t.Fatal("the channel is open once no request is in flight")
	}
	f.start()
	if next := f.InFlight(); next == nil || isClosed(next) {
		t.Error("a request after none has no open channel")
	}
}
