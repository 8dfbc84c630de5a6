package cacher

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
)

// BenchmarkStart measures a cache's start over 10,000 objects of 1 KiB with
// 10,000 events of history: the time until it is ready, until its history is
// filled, and the bytes etcd sends, cold (the current state only, as
// upstream) and warm (the history behind it filled from etcd).
//
//	go test -run '^$' -bench BenchmarkStart -benchtime 5x ./pkg/storage/cacher/
func BenchmarkStart(b *testing.B) {
	const objects = 10_000
	for _, bc := range []struct {
		name      string
		revisions int64
	}{{"cold", -1}, {"warm", objects}} {
		b.Run(bc.name, func(b *testing.B) {
			c := newTestCacher(b)
			writePods(b, c, objects, "a")
			writePods(b, c, objects, "b") // the history: one update of each
			current := c.Cacher
			cfg := c.cfg
			cfg.WarmStartRevisions = bc.revisions
			var elapsed, filled time.Duration
			var bytes float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				current.Stop()
				sentBefore := etcdSentBytes(b)
				start := time.Now()
				next, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				waitReady(b, next)
				elapsed += time.Since(start)
				if done := next.src.Backfilled(); done != nil {
					<-done
				}
				filled += time.Since(start)
				bytes += etcdSentBytes(b) - sentBefore
				current = next
			}
			b.StopTimer()
			current.Stop()
			since, head := current.log.Bounds()
			b.ReportMetric(float64(elapsed.Milliseconds())/float64(b.N), "ms/ready")
			b.ReportMetric(float64(filled.Milliseconds())/float64(b.N), "ms/history")
			b.ReportMetric(bytes/float64(b.N)/(1<<20), "etcd-MiB/start")
			b.ReportMetric(float64(head-since), "history-revisions")
		})
	}
}

// writePods puts n pods with a 1 KiB annotation straight into etcd, one
// revision each, the annotation's value changed to mark.
func writePods(tb testing.TB, c *testCacher, n int, mark string) {
	tb.Helper()
	payload := strings.Repeat(mark, 1024)
	var g errgroup.Group
	g.SetLimit(8)
	for i := 0; i < n; i++ {
		g.Go(func() error {
			pod := &examplev1.Pod{
				TypeMeta:   metav1.TypeMeta{APIVersion: "example.apiserver.k8s.io/v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%05d", i), Namespace: "ns", Annotations: map[string]string{"payload": payload}},
			}
			data, err := runtime.Encode(examplev1Blob, pod)
			if err != nil {
				return err
			}
			_, err = c.client.Put(context.Background(), fmt.Sprintf("%s/pods/ns/%s", etcd3testing.PathPrefix(), pod.Name), string(data))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
}

// etcdSentBytes reads what the test's embedded etcd has sent its clients.
func etcdSentBytes(tb testing.TB) float64 {
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "etcd_network_client_grpc_sent_bytes_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	tb.Fatal("the embedded etcd exports no etcd_network_client_grpc_sent_bytes_total")
	return 0
}
