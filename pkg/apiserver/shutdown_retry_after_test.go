package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestShutdownRetryAfter: requests are served until the shutdown delay has
// passed, then refused with 429, a Status and Retry-After: 1 (upstream's
// filter says 5; see shutdownRetryAfter for why we differ), except health
// checks, metrics and the loopback client.
func TestShutdownRetryAfter(t *testing.T) {
	initiated := make(chan struct{})
	clk := clocktesting.NewFakeClock(time.Now())
	served := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	h := WithShutdownRetryAfter(served, ShutdownRetryAfterConfig{Initiated: initiated, Delay: 5 * time.Second,
		Serializer: Codecs, Clock: clk})
	do := func(path, agent string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("User-Agent", agent)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	const watch = "/apis/fleet.example.com/v1beta1/assignments?watch=1"
	if code := do(watch, "client").Code; code != http.StatusOK {
		t.Fatalf("before the shutdown: %d, want 200", code)
	}
	close(initiated)
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return clk.HasWaiters(), nil }); err != nil {
		t.Fatal("the filter never waited for the shutdown delay")
	}
	if code := do(watch, "client").Code; code != http.StatusOK {
		t.Fatalf("during the shutdown delay: %d, want 200", code)
	}
	clk.Step(5 * time.Second)
	// The refusals start once the filter's goroutine has seen the delay pass.
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) {
			return do(watch, "client").Code == http.StatusTooManyRequests, nil
		}); err != nil {
		t.Fatal("requests were still served after the shutdown delay")
	}

	for _, tc := range []struct {
		path, agent string
		want        int
	}{
		{watch, "client", http.StatusTooManyRequests},
		{"/apis/fleet.example.com/v1beta1/namespaces/a/assignments/x", "kubectl", http.StatusTooManyRequests},
		{"/readyz", "kubelet", http.StatusOK},
		{"/livez", "kubelet", http.StatusOK},
		{"/healthz", "kubelet", http.StatusOK},
		{"/metrics", "prometheus", http.StatusOK},
		{watch, "kube-apiserver/v1.37.2", http.StatusOK},
	} {
		rec := do(tc.path, tc.agent)
		if rec.Code != tc.want {
			t.Errorf("%s as %s after the delay: %d, want %d", tc.path, tc.agent, rec.Code, tc.want)
			continue
		}
		if tc.want != http.StatusTooManyRequests {
			continue
		}
		var status metav1.Status
		if err := json.Unmarshal(rec.Body.Bytes(), &status); err != nil {
			t.Fatalf("%s: body %q is no Status: %v", tc.path, rec.Body, err)
		}
		if got := rec.Header().Get("Retry-After"); got != "1" || rec.Header().Get("Connection") != "close" ||
			status.Reason != metav1.StatusReasonTooManyRequests || status.Details == nil || status.Details.RetryAfterSeconds != 1 {
			t.Errorf("%s: Retry-After %q, Connection %q, Status %+v; want 1, close, TooManyRequests retrying after 1 s",
				tc.path, got, rec.Header().Get("Connection"), status)
		}
	}
}
