package cacher

import (
	"context"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/storage"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
)

// TestGaugeSharesAdd checks that two caches of one resource, as a server
// with a storage per version has, report the sum of their values under
// the gauge's one set of labels, and that a stopped cache takes its part
// out. Set on the gauge itself would report whichever cache set it last.
func TestGaugeSharesAdd(t *testing.T) {
	vec := compbasemetrics.NewGaugeVec(&compbasemetrics.GaugeOpts{Name: "test_gauge_shares"}, []string{"resource"})
	compbasemetrics.NewKubeRegistry().MustRegister(vec)
	a := &gaugeShare{g: vec.WithLabelValues("flunders")}
	b := &gaugeShare{g: vec.WithLabelValues("flunders")}
	for _, step := range []struct {
		name string
		do   func()
		want float64
	}{
		{"a has 100", func() { a.Set(100) }, 100},
		{"b has none", func() { b.Set(0) }, 100},
		{"b has 3", func() { b.Set(3) }, 103},
		{"a drops to 40", func() { a.Set(40) }, 43},
		{"a stops", func() {
			(&cacheMetrics{Metrics: &fanout.Metrics{Synced: a, Lagging: &gaugeShare{g: vec.WithLabelValues("x")},
				Snapshots: &gaugeShare{g: vec.WithLabelValues("x")}, History: &gaugeShare{g: vec.WithLabelValues("x")},
				HistoryBytes: &gaugeShare{g: vec.WithLabelValues("x")}, Capacity: &gaugeShare{g: vec.WithLabelValues("x")}},
				encoded: &gaugeShare{g: vec.WithLabelValues("x")}}).releaseGauges()
		}, 3},
	} {
		step.do()
		if got, _ := testutil.GetGaugeMetricValue(vec.WithLabelValues("flunders")); got != step.want {
			t.Fatalf("%s: the gauge reads %v, want %v", step.name, got, step.want)
		}
	}
}

// TestEncodedObjectsGauge checks that the cache reports how many object
// versions hold encodings: one once a watcher was sent a pod, none once
// the TTL passed without another send.
func TestEncodedObjectsGauge(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	c := newTestCacher(t, func(o *setupOptions) {
		o.config = func(cfg *Config) { cfg.Clock = clk }
	})
	waitReady(t, c.Cacher)
	createPod(t, c, "a")
	w, err := c.Watch(context.Background(), "/pods/ns", storage.ListOptions{ResourceVersion: "0", Predicate: storage.Everything, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	testkit.Recv(t, w.ResultChan(), "the ADDED event")
	// The gauge is shared with earlier tests' caches of pods.
	c.metrics.encoded.Set(-1)
	// Each step fires the cache's tick, which sets the gauge.
	clk.Step(fanout.BookmarkTick)
	testkit.WaitGauge(t, c.metrics.encoded.g, 1, "encoded objects")
	clk.Step(DefaultEncodingTTL)
	testkit.WaitGauge(t, c.metrics.encoded.g, 0, "encoded objects")
}
