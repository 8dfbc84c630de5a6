package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/sample-apiserver/pkg/apis/wardle/v1alpha1"
	"k8s.io/sample-apiserver/pkg/cmd/server"
	"k8s.io/sample-apiserver/pkg/generated/clientset/versioned"
)

// TestWardleThroughOurCache runs the wardle server as main does, over a
// real etcd on 127.0.0.1, and checks that its lists and watches work and
// are served by our cache:
//   - a list holds every flunder created;
//   - 100 watches with bookmarks each get the next flunder;
//   - a watch-list gets every flunder, then the initial-events-end bookmark;
//   - our cache's own metric counts those watchers, which upstream's Cacher
//     would not (swap the decorator back, and this fails);
//   - 100 more client watches open no etcd watch: each cached resource
//     has one (no cache at all would open one for each).
func TestWardleThroughOurCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := startWardle(t, ctx)
	client := versioned.NewForConfigOrDie(cfg).WardleV1alpha1().Flunders("wardle")

	const before = 3
	for i := range before {
		create(t, ctx, client, fmt.Sprintf("f-%d", i))
	}
	list, err := client.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != before {
		t.Fatalf("the list holds %d flunders, want %d", len(list.Items), before)
	}
	yes := true
	watchList, err := client.Watch(ctx, metav1.ListOptions{SendInitialEvents: &yes, AllowWatchBookmarks: true,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil {
		t.Fatal(err)
	}
	defer watchList.Stop()
	// etcd's watches once one client watches, a watch-list, and so each
	// cache, runs: 100 more clients must not add any.
	etcdWatchesBefore := etcdWatchers(t)

	const watchers = 100
	var ws []watch.Interface
	for i := range watchers {
		w, err := client.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true})
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		defer w.Stop()
		ws = append(ws, w)
	}

	create(t, ctx, client, "after")
	for i, w := range ws {
		next(t, w, func(ev watch.Event) bool { return ev.Type == watch.Added && name(ev) == "after" }, "watch %d", i)
	}
	seen := map[string]bool{}
	next(t, watchList, func(ev watch.Event) bool {
		if ev.Type == watch.Added {
			seen[name(ev)] = true
		}
		m, _ := ev.Object.(metav1.Object)
		return ev.Type == watch.Bookmark && m != nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"
	}, "the watch-list's initial-events-end bookmark")
	for i := range before {
		if !seen[fmt.Sprintf("f-%d", i)] {
			t.Errorf("the watch-list's initial events lack f-%d: %v", i, seen)
		}
	}

	// The cache updates its gauges every second.
	var got float64
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		got = ourWatchers(t, "flunders")
		return got >= watchers+1, nil
	}); err != nil {
		t.Errorf("our cache counts %v flunder watchers, want at least %d: is it serving the watches?", got, watchers+1)
	}
	// etcd's count may move by one on its own, as a cache re-opens its
	// watch; without a cache each of the 100 would add one.
	if got := etcdWatchers(t); got > etcdWatchesBefore+2 {
		t.Errorf("etcd holds %v watches after %d more clients began watching, %v before: want one per cached resource",
			got, watchers, etcdWatchesBefore)
	}
}

// startWardle serves wardle on 127.0.0.1 without a core API: no delegated
// authentication or authorization, admission or priority-and-fairness,
// which need a kube-apiserver. Everything else is main's.
func startWardle(t *testing.T, ctx context.Context) *rest.Config {
	t.Helper()
	etcd := testserver.RunEtcd(t, nil)
	o := server.NewWardleServerOptions(io.Discard, io.Discard)
	cmd := newCommand(ctx, o) // registers wardle's component versions
	if err := cmd.ParseFlags([]string{"--etcd-servers=" + strings.Join(etcd.Endpoints(), ",")}); err != nil {
		t.Fatal(err)
	}
	if err := o.ComponentGlobalsRegistry.Set(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.RecommendedOptions.SecureServing.Listener = ln
	o.RecommendedOptions.SecureServing.BindPort = ln.Addr().(*net.TCPAddr).Port
	o.RecommendedOptions.SecureServing.ServerCert.CertDirectory = t.TempDir()
	o.RecommendedOptions.Authentication = nil
	o.RecommendedOptions.Authorization = nil
	o.RecommendedOptions.CoreAPI = nil
	o.RecommendedOptions.Admission = nil
	o.RecommendedOptions.Features.EnablePriorityAndFairness = false

	serveCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(serveCtx, o) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("wardle did not stop within a minute")
		}
	})

	cfg := &rest.Config{Host: "https://" + ln.Addr().String(), TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS: -1}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("wardle exited: %v", err)
		default:
		}
		resp, err := hc.Get(cfg.Host + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == 200, nil
	})
	if err != nil {
		t.Fatalf("wardle never became ready: %v", err)
	}
	return cfg
}

func create(t *testing.T, ctx context.Context, client interface {
	Create(context.Context, *v1alpha1.Flunder, metav1.CreateOptions) (*v1alpha1.Flunder, error)
}, name string) {
	t.Helper()
	if _, err := client.Create(ctx, &v1alpha1.Flunder{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// next reads w until an event satisfies match, for at most 30 s.
func next(t *testing.T, w watch.Interface, match func(watch.Event) bool, what string, args ...any) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("%s: the watch ended", fmt.Sprintf(what, args...))
			}
			if match(ev) {
				return
			}
		case <-timeout:
			t.Fatalf("%s: nothing within 30 s", fmt.Sprintf(what, args...))
		}
	}
}

func name(ev watch.Event) string {
	if m, ok := ev.Object.(metav1.Object); ok {
		return m.GetName()
	}
	return ""
}

// ourWatchers sums our cache's watchers gauge for a wardle resource.
func ourWatchers(t *testing.T, resource string) float64 {
	t.Helper()
	return sum(t, legacyregistry.DefaultGatherer, "cached_apiserver_watch_cache_watchers", map[string]string{
		"group": "wardle.example.com", "resource": resource})
}

// etcdWatchers is how many watches the in-process etcd holds.
func etcdWatchers(t *testing.T) float64 {
	t.Helper()
	return sum(t, prometheus.DefaultGatherer, "etcd_debugging_mvcc_watcher_total", nil)
}

// sum adds the samples of a metric whose labels include labels.
func sum(t *testing.T, g prometheus.Gatherer, metric string, labels map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	found := false
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
		found = true
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				total += value(m)
			}
		}
	}
	if !found {
		t.Errorf("no metric %s", metric)
	}
	return total
}

func matches(m *dto.Metric, labels map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range labels {
		if have[k] != v {
			return false
		}
	}
	return true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}
