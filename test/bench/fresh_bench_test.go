package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// BenchmarkReadAfterWrite measures what a server's ingest of etcd's
// changes costs a client right after a write: a consistent read of what it
// just wrote (a list selecting it by name, which the cache serves once it
// holds etcd's current revision), and the write's delivery to watchers of
// its namespace. Issue 56 changed how the cache learns where an etcd
// revision ends; neither figure may lose more than 10% at the p99.
//
// It loads one etcd once, then runs each server over it in turn, round
// after round (takeTurns). FRESH_WRITES (300) writes are made one after
// the other, each followed by its read; FRESH_WATCHERS (50) watch. It
// reports, for the reads and the deliveries, the p50 and p99 from the
// write's acknowledgement. FRESH_ROUNDS (3), FRESH_IMPLS and FRESH_ALT
// pick the servers as WATCHLIST_IMPLS and WATCHLIST_ALT do.
func BenchmarkReadAfterWrite(b *testing.B) {
	writes, watchers := testkit.EnvInt("FRESH_WRITES", 300), testkit.EnvInt("FRESH_WATCHERS", 50)
	l := newLoaded(b, "FRESH", 1000)
	l.takeTurns(b, func(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, s *scaleServer) {
		const ns = "fresh"
		client := versioned.NewForConfigOrDie(cfg).FleetV1beta1().Assignments(ns)
		list, err := client.List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		// The watches end with the run, before the server stops.
		wctx, stopWatches := context.WithCancel(ctx)
		defer stopWatches()
		var mu sync.Mutex // guards received
		received := map[string][]time.Time{}
		nsURL := cfg.Host + "/apis/fleet.example.com/v1beta1/namespaces/" + ns + "/assignments"
		for range watchers {
			openWatch(wctx, b, hc, nsURL+"?watch=true&resourceVersion="+list.ResourceVersion, func(name string, at time.Time) {
				mu.Lock()
				received[name] = append(received[name], at)
				mu.Unlock()
			}, func() {}, func() { b.Error("a watch ended") })
		}
		acked := map[string]time.Time{}
		var reads []time.Duration
		for i := range writes {
			a := &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w-%04d", i)},
				Spec: v1beta1.AssignmentSpec{AgentName: "agent", Payload: "x"}}
			if _, err := client.Create(ctx, a, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			at := time.Now()
			acked[a.Name] = at
			q := url.Values{"fieldSelector": {"metadata.name=" + a.Name}}
			got := get(ctx, b, hc, nsURL+"?"+q.Encode())
			reads = append(reads, time.Since(at))
			if !containsName(got, a.Name) {
				b.Fatalf("a consistent list right after creating %s lacks it", a.Name)
			}
		}
		// The watchers' goroutines say nothing when they are done: poll.
		_ = wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			for name := range acked {
				if len(received[name]) < watchers {
					return false, nil
				}
			}
			return true, nil
		})
		var deliveries []time.Duration
		mu.Lock()
		for name, at := range acked {
			for _, r := range received[name] {
				deliveries = append(deliveries, r.Sub(at))
			}
		}
		mu.Unlock()
		b.ReportMetric(ms(percentile(reads, 0.5)), "read-p50-ms")
		b.ReportMetric(ms(percentile(reads, 0.99)), "read-p99-ms")
		b.ReportMetric(ms(percentile(deliveries, 0.5)), "delivery-p50-ms")
		b.ReportMetric(ms(percentile(deliveries, 0.99)), "delivery-p99-ms")
		b.ReportMetric(float64(len(deliveries))/float64(writes*watchers), "delivered-fraction")
	}, func(ctx context.Context, b *testing.B) {
		if _, err := l.etcd.Delete(ctx, assignmentsKey+"fresh/", clientv3.WithPrefix()); err != nil {
			b.Fatal(err)
		}
	})
}

// containsName reports whether a list's JSON holds an object named name.
func containsName(list []byte, name string) bool {
	return bytes.Contains(list, []byte(`"name":"`+name+`"`))
}
