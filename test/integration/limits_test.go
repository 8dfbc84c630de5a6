package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// TestMaxWatches runs a server with --max-watches=3 and fills it with a
// plain watch, a watch-list and a selected watch. A fourth watch, and a
// watch-list, get 429 with Retry-After and a message naming the limit; the
// open watches go on receiving events; once one ends, a new watch is
// served again.
func TestMaxWatches(t *testing.T) {
	s := startServer(t, t.TempDir(), "--max-watches=3")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := s.Client.FleetV1beta1().Assignments("limits")
	rejectedBefore := metricValue(t, legacyregistry.DefaultGatherer, "cached_apiserver_rejected_watches_total", nil)

	yes := true
	var open []watch.Interface
	for _, opts := range []metav1.ListOptions{
		{},
		{SendInitialEvents: &yes, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
		{FieldSelector: "spec.agentName=agent-1"},
	} {
		w, err := client.Watch(ctx, opts)
		if err != nil {
			t.Fatalf("watch %d of 3: %v", len(open)+1, err)
		}
		defer w.Stop()
		open = append(open, w)
	}

	// client-go would retry a 429 after its Retry-After; a raw request shows the answer.
	hc, err := rest.HTTPClientFor(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(query string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet,
			s.Config.Host+"/apis/fleet.example.com/v1beta1/namespaces/limits/assignments?"+query, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var status metav1.Status
		if err := json.Unmarshal(body, &status); err != nil {
			t.Fatalf("%s: %d with a body that is no Status: %q", query, resp.StatusCode, body)
		}
		if resp.StatusCode != http.StatusTooManyRequests || status.Reason != metav1.StatusReasonTooManyRequests {
			t.Errorf("%s: got %d %s, want 429 TooManyRequests", query, resp.StatusCode, status.Reason)
		}
		if got := resp.Header.Get("Retry-After"); got == "" {
			t.Errorf("%s: no Retry-After", query)
		}
		if !strings.Contains(status.Message, "limit of 3 watches (--max-watches)") {
			t.Errorf("%s: message %q does not name the limit", query, status.Message)
		}
	}
	refused("watch=true")
	refused("watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
	if got := metricValue(t, legacyregistry.DefaultGatherer, "cached_apiserver_rejected_watches_total", nil) - rejectedBefore; got != 2 {
		t.Errorf("cached_apiserver_rejected_watches_total rose by %v, want 2", got)
	}
	if got := metricValue(t, legacyregistry.DefaultGatherer, "cached_apiserver_open_watches", nil); got < 3 {
		t.Errorf("cached_apiserver_open_watches = %v, want at least the 3 open here", got)
	}
	// Lists are not watches.
	if _, err := client.List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("a list at the watch limit: %v", err)
	}

	// The open watches are untouched.
	if _, err := client.Create(ctx, &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: "a"},
		Spec: v1beta1.AssignmentSpec{AgentName: "agent-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, w := range open {
		waitForEvent(t, w, func(ev watch.Event) bool {
			a, ok := ev.Object.(*v1beta1.Assignment)
			return ok && ev.Type == watch.Added && a.Name == "a"
		}, "watch %d", i)
	}

	// One ends; its place is free once its handler returns.
	open[0].Stop()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		w, err := client.Watch(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		w.Stop()
		return true, nil
	})
	if err != nil {
		t.Fatal("no new watch was served after one of the three ended")
	}
}

// waitForEvent reads w until an event satisfies match.
func waitForEvent(t testing.TB, w watch.Interface, match func(watch.Event) bool, what string, args ...any) {
	t.Helper()
	what = fmt.Sprintf(what, args...)
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("%s: ended before the event", what)
			}
			if match(ev) {
				return
			}
		case <-timeout:
			t.Fatalf("%s: no event within 30s", what)
		}
	}
}
