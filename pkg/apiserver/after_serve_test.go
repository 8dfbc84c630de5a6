package apiserver

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/routine"
)

// TestWatchLimitHoldsUntilServed checks that a watch counts against
// --max-watches until it has been served, also when the generic server
// serves it after the handler chain has returned (APIServingWithRoutine):
// the handler below leaves its serving as a task, as handlers/get.go does,
// and the count must still be 1 while that task runs.
func TestWatchLimitHoldsUntilServed(t *testing.T) {
	tests := []struct {
		name    string
		routine bool
		panics  bool
	}{
		{name: "served in the chain"},
		{name: "served after the chain, as with APIServingWithRoutine", routine: true},
		{name: "a panic in the chain", panics: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var limit *watchLimit
			var openWhileServing int64 = -1
			serve := func() { openWhileServing = limit.open.Load() }
			inner := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				if tc.panics {
					panic("boom")
				}
				if task := routine.TaskFrom(req.Context()); task != nil {
					task.Func = serve
					return
				}
				serve()
			})
			limit = &watchLimit{max: 1}
			h := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				if !limit.acquire() {
					t.Fatal("the limit refused the first watch")
				}
				serveThen(inner, w, req, limit.release)
			}))
			if tc.routine {
				h = routine.WithRoutine(h, func(*http.Request, *request.RequestInfo) bool { return true })
			}
			req := httptest.NewRequest(http.MethodGet, "/apis/g/v1/things?watch=1", nil)
			req = req.WithContext(request.WithRequestInfo(req.Context(), &request.RequestInfo{IsResourceRequest: true, Verb: "watch"}))
			func() {
				defer func() { _ = recover() }()
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			if !tc.panics && openWhileServing != 1 {
				t.Errorf("open watches while the watch was served = %d, want 1", openWhileServing)
			}
			if n := limit.open.Load(); n != 0 {
				t.Errorf("open watches once served = %d, want 0", n)
			}
		})
	}
}
