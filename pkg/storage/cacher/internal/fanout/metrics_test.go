package fanout

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	upstream "k8s.io/apiserver/pkg/storage/cacher/metrics"
	compbasemetrics "k8s.io/component-base/metrics"
)

// gauge is a Gauge no test reads: the fan-out's tests assert on its
// counters and the waiting gauge.
type gauge struct{}

func (gauge) Set(float64) {}

// newTestMetrics returns metrics registered in a registry of their own,
// so that testutil can read them and tests do not share them.
func newTestMetrics() *Metrics {
	reg := compbasemetrics.NewKubeRegistry()
	counter := func(name string) compbasemetrics.CounterMetric {
		c := compbasemetrics.NewCounter(&compbasemetrics.CounterOpts{Name: name})
		reg.MustRegister(c)
		return c
	}
	histogram := func(name string) compbasemetrics.ObserverMetric {
		h := compbasemetrics.NewHistogram(&compbasemetrics.HistogramOpts{Name: name})
		reg.MustRegister(h)
		return h
	}
	waiting := compbasemetrics.NewGauge(&compbasemetrics.GaugeOpts{Name: "init_waiting"})
	reg.MustRegister(waiting)
	return &Metrics{
		Dispatched: counter("dispatched"), Terminated: counter("terminated"), Parked: counter("parked"),
		Evicted: counter("evicted"), InitEvents: counter("init_events"),
		InitWaiting: waiting, Lag: histogram("lag"), ReadWait: histogram("read_wait"),
		Synced: &gauge{}, Lagging: &gauge{}, Snapshots: &gauge{}, History: &gauge{}, HistoryBytes: &gauge{}, Capacity: &gauge{},
		Dispatch: upstream.NewWatcherMetricsObservers(schema.GroupResource{Resource: "pods"}),
	}
}
