package bench

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// BenchmarkObjectMemory measures what the cache holds an object in, and
// how long it takes to hold them all: the heap in use per object once the
// server is ready over a loaded etcd and ours has filled its history from
// etcd's (a warm start), and again after a restart with no
// history (--watch-cache-warm-start-revisions=0, which upstream's cache
// always is), with the time from the new process to a served list, the
// RSS, and how much of it is free heap the start's peak left behind. The
// heap is the heap in use, which bench-scale compares; live-B/object is
// what of it is live, without the free slots among the objects.
//
// It is the cheap same-run A/B for what an object costs: the servers take
// turns over one etcd loaded once, as in BenchmarkConcurrentLists, so a
// build without one of the object's mechanisms (the interner, the page
// packing) runs beside ours in minutes, where make bench-scale takes an
// hour. MEMORY_HEAP_PROFILES=dir keeps each server's heap profile with no
// history (the last round's). MEMORY_OBJECTS (100,000) and MEMORY_PAYLOAD (1024 bytes an object) size it; MEMORY_ROUNDS (3) repeats it;
// MEMORY_IMPLS and MEMORY_ALT pick the servers as WATCHLIST_IMPLS and
// WATCHLIST_ALT do.
func BenchmarkObjectMemory(b *testing.B) {
	l := newLoaded(b, "MEMORY", 100_000)
	objects := l.objects
	l.takeTurns(b, func(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, s *scaleServer) {
		waitHistoryFilled(ctx, b, hc, cfg.Host)
		heap, rss := serverMemory(ctx, b, hc, cfg.Host, s.proc.Pid())
		b.ReportMetric(float64(heap)/float64(objects), "heap-B/object")
		b.ReportMetric(float64(liveHeap(ctx, b, hc, cfg.Host))/float64(objects), "live-B/object")
		b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")

		s.stop(b)
		warm := s.args
		s.args = append(s.args[:len(s.args):len(s.args)], "--watch-cache-warm-start-revisions=0")
		defer func() { s.args = warm }()
		t0 := time.Now()
		s.start(b)
		waitCacheReady(ctx, b, hc, base, objects)
		b.ReportMetric(ms(time.Since(t0)), "restart-ready-ms")
		heap, rss = serverMemory(ctx, b, hc, cfg.Host, s.proc.Pid())
		b.ReportMetric(float64(heap)/float64(objects), "drained-heap-B/object")
		b.ReportMetric(float64(liveHeap(ctx, b, hc, cfg.Host))/float64(objects), "drained-live-B/object")
		b.ReportMetric(float64(rss)/(1<<20), "drained-rss-MiB")
		b.ReportMetric(float64(unreturnedHeap(ctx, b, hc, cfg.Host))/(1<<20), "drained-unreturned-MiB")
		saveHeapProfile(ctx, b, hc, cfg.Host, "MEMORY_HEAP_PROFILES", "drained-"+filepath.Base(s.bin)+".pb.gz")
	}, nil)
}
