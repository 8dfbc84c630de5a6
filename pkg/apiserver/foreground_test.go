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
			inHandler, release := make(chan bool), make(chan struct{})
			h := WithForeground(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				inHandler <- f.Busy()
				<-release
			}), f, longRunning)
			req := httptest.NewRequest(tc.method, tc.url, nil)
			info, err := infos.NewRequestInfo(req)
			if err != nil {
				t.Fatal(err)
			}
			req = req.WithContext(request.WithRequestInfo(req.Context(), info))
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			if busy := <-inHandler; busy != tc.counts {
				t.Errorf("busy while the request is served: %v, want %v", busy, tc.counts)
			}
			clk.Step(time.Hour) // a request in flight is busy however long it takes
			if busy := f.Busy(); busy != tc.counts {
				t.Errorf("busy an hour into the request: %v, want %v", busy, tc.counts)
			}
			close(release)
			<-done
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
