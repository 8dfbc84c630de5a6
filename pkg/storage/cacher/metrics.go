package cacher

import (
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	upstream "k8s.io/apiserver/pkg/storage/cacher/metrics"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// The cache reports under upstream's watch-cache metric names, which the
// generic server registers (k8s.io/apiserver/pkg/storage/cacher/metrics),
// so that kube-apiserver dashboards and alerts work unchanged. Only what
// upstream has no name for gets a cached_apiserver_ metric, registered here.
var (
	watchersGauge = gaugeVec("watchers",
		"Open watchers, by whether they are synced (fed directly) or catching up from the event log.", "state")
	parkedCounter = counterVec("parked_watchers_total",
		"Watchers whose channel was full, moved to catch up from the event log instead of being closed.")
	catchUpLagEvents = histogramVec("catch_up_events", compbasemetrics.ExponentialBuckets(1, 4, 10),
		"Events a watcher read from the event log in one catch-up, before it was synced again.")
	snapshotsGauge = gaugeVec("snapshots",
		"Point-in-time snapshots held for exact-resourceVersion lists and pagination.")
	historyEventsGauge = gaugeVec("history_events",
		"Events held in the event log.")
	historyBytesGauge = gaugeVec("history_bytes",
		"Estimated bytes of the object versions the event log holds; Config.HistoryBudget bounds it.")
	historyEvictedCounter = counterVec("history_evicted_events_total",
		"Events that left the event log while still inside its history window, because the log reached its "+
			"byte budget. A watch from their resourceVersions gets 410.")
	encodedObjectsGauge = gaugeVec("encoded_objects",
		"Cached object versions holding the encodings made to send them to watchers, shared by every "+
			"watcher they are sent to; each drops them once a whole encoding TTL passes without a send.")
	initialEventsWaiting = gaugeVec("initial_events_waiting_watchers",
		"Watchers waiting for their turn to stream initial events (watch-lists, and watches from "+
			"resourceVersion 0); --watch-cache-initial-events-concurrency bounds how many stream at once.")
	etcdWatchRestarts = counterVec("etcd_watch_restarts_total",
		"Times the cache re-opened its etcd watch from its head without re-listing, by why the watch ended: "+
			"closed, silent, no_leader, etcd_unavailable. Watchers stay open through these.", "reason")
	relistsCounter = counterVec("relists_total",
		"Times the cache listed etcd again and ended its watchers with 410, by why: compacted, unreadable, "+
			"inconsistent, etcd_unavailable.", "reason")
	// 10 s is a bucket's bound: the alert on gaps longer than that
	// (artifacts/monitoring) reads it.
	etcdWatchGap = histogramVec("etcd_watch_gap_seconds", []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		"Time without a working etcd watch: from the watch failing until a new one delivered an event or "+
			"a progress notification. The sum is the total time events could not flow.")
	replayedCounter = counterVec("replayed_events_total",
		"Events etcd delivered again on the cache's watch, at or below a revision the cache had already "+
			"applied, and that the cache dropped. A watch the etcd client resumes on another member can "+
			"repeat events (etcd-io/etcd#20221); applying one would put an old version back.")
	backfillsCounter = counterVec("backfills_total",
		"Warm starts' backfills of the history from etcd, by result: started; filled; retried, an attempt that "+
			"failed for a reason that passes (etcd paused or without a leader) and is tried again; given_up, as "+
			"when etcd compacted past it or the log moved on; abandoned by a re-list or a stop.", "result")
	backfillEventsGauge = gaugeVec("backfill_events",
		"Events a running backfill holds in memory, replayed from etcd and not yet in the event log.")
	corruptCounter = counterVec("corrupt_objects_total",
		"Reads of a cached object whose compressed bytes did not decompress to the bytes they were made from "+
			"(their CRC-32C), which were refused: the cache lists again (relists_total, reason unreadable). "+
			"Only with --watch-cache-compression.")
	pageRetriesCounter = counterVec("list_page_retries_total",
		"Pages of the cache's own lists of etcd read again at the list's revision after etcd or the way to it "+
			"failed them (a member restarting, a stream cut short), the pages already read kept.")
	unreadyGauge = gaugeVec("unready",
		"Caches of the resource that cannot serve: initializing, or listing etcd again. Reads they would "+
			"serve get 429 meanwhile (or go to etcd with --watch-cache-consistent-read-fallback).")

	registerOnce sync.Once
)

// gaugeVec, counterVec and histogramVec make a cached_apiserver_watch_cache_
// metric with the group and resource labels, and extra ones.
func gaugeVec(name, help string, extra ...string) *compbasemetrics.GaugeVec {
	return compbasemetrics.NewGaugeVec(&compbasemetrics.GaugeOpts{Namespace: namespace, Subsystem: subsystem, Name: name,
		Help: help, StabilityLevel: compbasemetrics.ALPHA}, append([]string{"group", "resource"}, extra...))
}

func counterVec(name, help string, extra ...string) *compbasemetrics.CounterVec {
	return compbasemetrics.NewCounterVec(&compbasemetrics.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name,
		Help: help, StabilityLevel: compbasemetrics.ALPHA}, append([]string{"group", "resource"}, extra...))
}

func histogramVec(name string, buckets []float64, help string) *compbasemetrics.HistogramVec {
	return compbasemetrics.NewHistogramVec(&compbasemetrics.HistogramOpts{Namespace: namespace, Subsystem: subsystem, Name: name,
		Help: help, Buckets: buckets, StabilityLevel: compbasemetrics.ALPHA}, []string{"group", "resource"})
}

const namespace, subsystem = "cached_apiserver", "watch_cache"

func registerMetrics() {
	registerOnce.Do(func() {
		// Upstream's names are registered by the generic server; registering
		// here too makes them work for a cache used without one, as in tests.
		upstream.Register()
		legacyregistry.MustRegister(watchersGauge, parkedCounter, catchUpLagEvents, snapshotsGauge, historyEventsGauge,
			historyBytesGauge, historyEvictedCounter, encodedObjectsGauge, initialEventsWaiting, etcdWatchRestarts, relistsCounter, etcdWatchGap, replayedCounter, backfillsCounter, backfillEventsGauge, unreadyGauge, corruptCounter, pageRetriesCounter)
		legacyregistry.CustomMustRegister(&gzipRunsCollector{}, &floorCollector{})
	})
}

// cacheMetrics are one resource's metrics, with label values bound once.
type cacheMetrics struct {
	// Metrics is what the fan-out reports.
	*fanout.Metrics
	// source is what the source reports.
	source source.Metrics
	gr     schema.GroupResource
	// The gauges a cache sets are shares: see gaugeShare.
	encoded *gaugeShare
	unready *gaugeShare
	// corrupt counts the corrupt objects' reads refused.
	corrupt compbasemetrics.CounterMetric
}

func newCacheMetrics(gr schema.GroupResource) *cacheMetrics {
	registerMetrics()
	g, r := gr.Group, gr.Resource
	// Every label set of the counters alerts read exists from the start, at
	// 0: Prometheus' increase() sees no increase in a series that appears
	// at 1, so an alert on the first relist would never fire.
	for _, reason := range []string{source.EndClosed, source.EndSilent, source.EndNoLeader, source.EndUnavailable} {
		etcdWatchRestarts.WithLabelValues(g, r, reason)
	}
	for _, reason := range []string{source.EndCompacted, source.EndUnreadable, source.EndInconsistent, source.EndUnavailable} {
		relistsCounter.WithLabelValues(g, r, reason)
	}
	for _, result := range []string{source.BackfillStarted, source.BackfillFilled, source.BackfillRetried,
		source.BackfillGaveUp, source.BackfillAbandoned} {
		backfillsCounter.WithLabelValues(g, r, result)
	}
	for _, status := range []string{source.CheckSuccess, source.CheckFailure, source.CheckError} {
		upstream.StorageConsistencyCheckTotal.WithLabelValues(g, r, status)
	}
	m := &cacheMetrics{
		Metrics: &fanout.Metrics{
			Dispatched:   upstream.EventsCounter.WithLabelValues(g, r),
			Terminated:   upstream.TerminatedWatchersCounter.WithLabelValues(g, r),
			Parked:       parkedCounter.WithLabelValues(g, r),
			Evicted:      historyEvictedCounter.WithLabelValues(g, r),
			InitEvents:   upstream.InitCounter.WithLabelValues(g, r),
			InitWaiting:  initialEventsWaiting.WithLabelValues(g, r),
			Lag:          catchUpLagEvents.WithLabelValues(g, r),
			ReadWait:     upstream.WatchCacheReadWait.WithLabelValues(g, r),
			Synced:       &gaugeShare{g: watchersGauge.WithLabelValues(g, r, "synced")},
			Lagging:      &gaugeShare{g: watchersGauge.WithLabelValues(g, r, "catching_up")},
			Snapshots:    &gaugeShare{g: snapshotsGauge.WithLabelValues(g, r)},
			History:      &gaugeShare{g: historyEventsGauge.WithLabelValues(g, r)},
			HistoryBytes: &gaugeShare{g: historyBytesGauge.WithLabelValues(g, r)},
			Capacity:     &gaugeShare{g: upstream.WatchCacheCapacity.WithLabelValues(g, r)},
			Dispatch:     upstream.NewWatcherMetricsObservers(gr),
		},
		gr:      gr,
		encoded: &gaugeShare{g: encodedObjectsGauge.WithLabelValues(g, r)},
		unready: &gaugeShare{g: unreadyGauge.WithLabelValues(g, r)},
		corrupt: corruptCounter.WithLabelValues(g, r),
	}
	m.source = source.Metrics{
		Received:     upstream.EventsReceivedCounter.WithLabelValues(g, r),
		Replayed:     replayedCounter.WithLabelValues(g, r),
		Listed:       upstream.WatchCacheInitializations.WithLabelValues(g, r),
		ListFailed:   upstream.WatchCacheInitializationErrors.WithLabelValues(g, r),
		PageRetried:  pageRetriesCounter.WithLabelValues(g, r),
		ListDuration: upstream.WatchCacheInitializationDuration.WithLabelValues(g, r),
		Gap:          etcdWatchGap.WithLabelValues(g, r),
		Restarted:    func(reason string) { etcdWatchRestarts.WithLabelValues(g, r, reason).Inc() },
		Relisted:     func(reason string) { relistsCounter.WithLabelValues(g, r, reason).Inc() },
		Checked: func(status string) {
			upstream.StorageConsistencyCheckTotal.WithLabelValues(g, r, status).Inc()
		},
		ResourceVersion: func(rv uint64) { upstream.RecordResourceVersion(gr, rv) },
		Backfill:        func(result string) { backfillsCounter.WithLabelValues(g, r, result).Inc() },
		BackfillEvents:  backfillEventsGauge.WithLabelValues(g, r),
	}
	return m
}

// gaugeShare is one cache's part of a gauge. A server may serve one
// resource from several storages, each with its own cache (sample-apiserver
// has one per version), and their gauges have the same labels: each cache
// adds what its value moved, so the gauge is their sum instead of whichever
// set it last. A share has one writer: the cache's tick goroutine, or for
// unready its readiness, under readiness' mutex.
type gaugeShare struct {
	g    compbasemetrics.GaugeMetric
	last float64
}

func (s *gaugeShare) Set(v float64) {
	s.g.Add(v - s.last)
	s.last = v
}

// releaseGauges takes a stopped cache's shares out of the gauges; unready
// is its readiness', which stopping sets to 0.
func (m *cacheMetrics) releaseGauges() {
	for _, s := range []fanout.Gauge{m.Synced, m.Lagging, m.Snapshots, m.History, m.HistoryBytes, m.Capacity, m.encoded} {
		s.Set(0)
	}
}

func (m *cacheMetrics) consistentRead(success, fallback bool) {
	upstream.ConsistentReadTotal.WithLabelValues(m.gr.Group, m.gr.Resource,
		strconv.FormatBool(success), strconv.FormatBool(fallback)).Inc()
}

func (m *cacheMetrics) list(index string, fetched, returned int) {
	upstream.RecordListCacheMetrics(m.gr, index, fetched, returned)
}

// shardedWatchStarted and shardedWatchStopped count open sharded watches in
// upstream's apiserver_watch_shards_total, registered while the
// ShardedListAndWatch feature gate is on.
func (m *cacheMetrics) shardedWatchStarted() { upstream.RecordShardedWatchStarted(m.gr) }
func (m *cacheMetrics) shardedWatchStopped() { upstream.RecordShardedWatchStopped(m.gr) }

// gzipRunsDesc counts the runs GzipStreams compressed, in every resource.
var gzipRunsDesc = compbasemetrics.NewDesc(namespace+"_"+subsystem+"_gzip_runs_total",
	"Runs of watch events or list items compressed for a gzip response, by whether the response compressed "+
		"the run itself (compressed) or sent it as another response had compressed it (shared).",
	[]string{"result"}, nil, compbasemetrics.ALPHA, "")

// gzipRunsCollector reads the counts of runs when scraped.
type gzipRunsCollector struct {
	compbasemetrics.BaseStableCollector
}

func (*gzipRunsCollector) DescribeWithStability(ch chan<- *compbasemetrics.Desc) { ch <- gzipRunsDesc }

func (*gzipRunsCollector) CollectWithStability(ch chan<- compbasemetrics.Metric) {
	made, shared := object.RunsCompressed()
	ch <- compbasemetrics.NewLazyConstMetric(gzipRunsDesc, compbasemetrics.CounterValue, float64(made), "compressed")
	ch <- compbasemetrics.NewLazyConstMetric(gzipRunsDesc, compbasemetrics.CounterValue, float64(shared), "shared")
}

// floorDesc is each resource's floor (Cacher.Floor), read when scraped.
var floorDesc = compbasemetrics.NewDesc(namespace+"_"+subsystem+"_floor_resource_version",
	"The oldest resourceVersion a watch of the resource can resume from without a 410: the later of etcd's "+
		"compaction and the oldest the cache's history holds, or, while a warm start's backfill runs, the one "+
		"it fills from. Where several caches serve one resource, the latest of theirs. 0 while no cache serves it.",
	[]string{"group", "resource"}, nil, compbasemetrics.ALPHA, "")

// liveCaches are the caches running, whose floors are scraped.
var liveCaches struct {
	// mu guards set.
	mu  sync.Mutex
	set map[*Cacher]struct{}
}

func addLive(c *Cacher) {
	liveCaches.mu.Lock()
	defer liveCaches.mu.Unlock()
	if liveCaches.set == nil {
		liveCaches.set = map[*Cacher]struct{}{}
	}
	liveCaches.set[c] = struct{}{}
}

func removeLive(c *Cacher) {
	liveCaches.mu.Lock()
	defer liveCaches.mu.Unlock()
	delete(liveCaches.set, c)
}

// floorCollector reports the floor of every resource a live cache serves.
type floorCollector struct {
	compbasemetrics.BaseStableCollector
}

func (*floorCollector) DescribeWithStability(ch chan<- *compbasemetrics.Desc) { ch <- floorDesc }

func (*floorCollector) CollectWithStability(ch chan<- compbasemetrics.Metric) {
	liveCaches.mu.Lock()
	caches := make([]*Cacher, 0, len(liveCaches.set))
	for c := range liveCaches.set {
		caches = append(caches, c)
	}
	liveCaches.mu.Unlock()
	floors := map[schema.GroupResource]uint64{}
	for _, c := range caches {
		if c.ReadinessCheck() != nil {
			continue
		}
		gr := c.cfg.GroupResource
		floors[gr] = max(floors[gr], c.Floor())
	}
	for gr, floor := range floors {
		ch <- compbasemetrics.NewLazyConstMetric(floorDesc, compbasemetrics.GaugeValue, float64(floor), gr.Group, gr.Resource)
	}
}
