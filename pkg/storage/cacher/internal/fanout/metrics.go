package fanout

import (
	upstream "k8s.io/apiserver/pkg/storage/cacher/metrics"
	compbasemetrics "k8s.io/component-base/metrics"
)

// Metrics is what the fan-out reports, under its resource's labels. The
// cache makes and registers them.
type Metrics struct {
	// Dispatched counts the events offered to watchers, Terminated the
	// watchers the cache ended, Parked those moved to catch up from the
	// history, and Evicted the events that left the history inside its
	// window, for its byte budget.
	Dispatched, Terminated, Parked, Evicted compbasemetrics.CounterMetric
	// InitEvents counts the initial events sent.
	InitEvents compbasemetrics.CounterMetric
	// InitWaiting is the watchers waiting for a turn at the gate.
	InitWaiting compbasemetrics.GaugeMetric
	// Lag observes the events one catch-up read, and ReadWait how long a
	// read waited for the cache to be fresh enough.
	Lag, ReadWait compbasemetrics.ObserverMetric
	// Synced and Lagging count the watchers; Snapshots, History,
	// HistoryBytes and Capacity are the store's and the history's sizes.
	Synced, Lagging, Snapshots, History, HistoryBytes, Capacity Gauge
	// Dispatch observes the stages of upstream's dispatch latency.
	Dispatch *upstream.WatcherMetricsObservers
}

// Gauge is a gauge the fan-out sets to a value.
type Gauge interface{ Set(float64) }
