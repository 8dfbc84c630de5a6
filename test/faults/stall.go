package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// stallReport is what a test prints when the cache's etcd watches made no
// progress where they should have: which of the server's goroutines wait
// in its watches, and etcd's own count of its watches, so that a failure
// seen once in CI says whether the cache's client or etcd held them. It is
// how TestWarmStartSurvivesPausedEtcd's intermittent failure was traced to
// etcd's own pacing of watches that start in the past (etcdDelivery).
type stallReport struct {
	// goroutines are the server's goroutines that wait in the cache's
	// source or in etcd's client watch, with their stacks.
	goroutines string
	// etcdWatches are etcd's metrics of its watches and watch streams.
	etcdWatches string
	// etcdGoroutines are etcd's goroutines that serve or sync watches.
	etcdGoroutines string
}

// stallGoroutine reports whether a goroutine's stack is one a stalled watch
// shows: the cache's source, etcd's client watch, or gRPC's wait for a
// connection.
func stallGoroutine(stack string) bool {
	return containsAny(stack, "cacher/internal/source.", "etcd/client/v3.(*watchGRPCStream)", "etcd/client/v3.(*watcher)",
		"grpc.(*pickerWrapper)")
}

// etcdStallGoroutine reports whether a goroutine of etcd's serves or syncs
// watches: its watch streams' loops, its watchable store's.
func etcdStallGoroutine(stack string) bool {
	return containsAny(stack, "v3rpc.(*serverWatchStream)", "mvcc.(*watchableStore)", "mvcc.(*watchStream)")
}

func containsAny(stack string, subs ...string) bool {
	for _, s := range subs {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}

// etcdWatchMetric reports whether a line of etcd's metrics counts its
// watches: how many it holds, how many are slow or wait to be sent, and the
// watch streams' messages and ends.
func etcdWatchMetric(line string) bool {
	if strings.HasPrefix(line, "#") {
		return false
	}
	for _, m := range []string{"etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_slow_watcher_total",
		"etcd_debugging_mvcc_pending_events_total", "etcd_debugging_mvcc_watch_stream_total", "etcd_debugging_mvcc_events_total"} {
		if strings.HasPrefix(line, m) {
			return true
		}
	}
	// gRPC's counts by method and code, of etcd's watch service, but the
	// codes that never occurred.
	return strings.Contains(line, `grpc_service="etcdserverpb.Watch"`) && !strings.HasSuffix(line, " 0")
}

// reportStall gathers a stallReport from s and etcd's first client URL.
// What it cannot read it says so in place of the figures.
func reportStall(ctx context.Context, s *apiServer, etcdURL string) stallReport {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var r stallReport
	dump, err := s.raw.Get().AbsPath("/debug/pprof/goroutine").Param("debug", "2").DoRaw(ctx)
	r.goroutines = goroutines(dump, err, stallGoroutine)
	dump, err = get(ctx, etcdURL+"/debug/pprof/goroutine?debug=2")
	r.etcdGoroutines = goroutines(dump, err, etcdStallGoroutine)
	r.etcdWatches = etcdWatchMetrics(ctx, etcdURL)
	return r
}

// goroutines keeps the goroutines of a dump that keep says to, or says
// why there is no dump.
func goroutines(dump []byte, err error, keep func(string) bool) string {
	if err != nil {
		return fmt.Sprintf("(reading the goroutines: %v)", err)
	}
	var kept []string
	for _, g := range strings.Split(string(dump), "\n\n") {
		if keep(g) {
			kept = append(kept, g)
		}
	}
	return strings.Join(kept, "\n\n")
}

func get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

func etcdWatchMetrics(ctx context.Context, url string) string {
	lines, err := memberMetrics(ctx, url)
	if err != nil {
		return fmt.Sprintf("(reading etcd's metrics: %v)", err)
	}
	var kept []string
	for _, line := range lines {
		if etcdWatchMetric(line) {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

func (r stallReport) String() string {
	return fmt.Sprintf("etcd's watches:\n%s\netcd's goroutines that serve watches:\n%s\nthe server's goroutines in its etcd watches:\n%s",
		r.etcdWatches, r.etcdGoroutines, r.goroutines)
}
