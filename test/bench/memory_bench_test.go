package bench

import (
	"context"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// BenchmarkObjectMemory measures what the cache holds an object in, and
// how long it takes to hold them all: the heap in use per object once the
// server is ready over a loaded etcd and ours has filled its history from
// etcd's (a warm start), the time from a new process to a served list
// after a restart as it comes (warm for ours), and again after a restart
// with no history (--watch-cache-warm-start-revisions=0, which upstream's
// cache always is): that time, the heap, the RSS, and how much of it is
// free heap the start's peak left behind. The
// heap is the heap in use, which bench-scale compares; live-B/object is
// what of it is live, without the free slots among the objects.
//
// It is the cheap same-run A/B for what an object costs: the servers take
// turns over one etcd loaded once, as in BenchmarkConcurrentLists, so a
// build without one of the object's mechanisms (the interner, the page
// packing) runs beside ours in minutes, where make bench-scale takes an
// hour. MEMORY_HEAP_PROFILES=dir keeps each server's heap profiles of
// the last round: warm-*, with the history, and drained-*, with none.
// MEMORY_OBJECTS (100,000) and MEMORY_PAYLOAD (1024 bytes an object) size
// it; MEMORY_ROUNDS (3) repeats it; MEMORY_IMPLS and MEMORY_ALT pick the
// servers as WATCHLIST_IMPLS and WATCHLIST_ALT do.
//
// MEMORY_UPDATED=<percent> then updates that share of the objects, picked
// at random, and measures again (updated-*): what a cache that was listed
// at once, and then only partly changed, still holds. The restart with no
// history keeps at most one event in ours (--watch-cache-history-budget=1),
// so that what the old versions leave held is what their neighbours in
// memory pin. Upstream's cache keeps its own history of them, which no flag
// empties: compare ours with ours.
func BenchmarkObjectMemory(b *testing.B) {
	l := newLoaded(b, "MEMORY", 100_000)
	objects := l.objects
	updated := min(testkit.EnvInt("MEMORY_UPDATED", 0), 100)
	updates := 0
	l.takeTurns(b, func(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, s *scaleServer) {
		waitHistoryFilled(ctx, b, hc, cfg.Host)
		heap, rss := serverMemory(ctx, b, hc, cfg.Host, s.proc.Pid())
		b.ReportMetric(float64(heap)/float64(objects), "heap-B/object")
		b.ReportMetric(float64(liveHeap(ctx, b, hc, cfg.Host))/float64(objects), "live-B/object")
		b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")
		saveHeapProfile(ctx, b, hc, cfg.Host, "MEMORY_HEAP_PROFILES", "warm-"+filepath.Base(s.bin)+".pb.gz")

		// A restart as it comes: ours fills its history from etcd behind
		// the list that makes it ready (a warm start); upstream's cache
		// always starts cold.
		s.stop(b)
		t0 := time.Now()
		s.start(b)
		waitCacheReady(ctx, b, hc, base, objects)
		b.ReportMetric(ms(time.Since(t0)), "restart-warm-ready-ms")
		waitHistoryFilled(ctx, b, hc, cfg.Host)
		// The CPU the new process took to hold the objects and the history.
		cpu, _ := procStats(b, s.proc.Pid())
		b.ReportMetric(ms(cpu), "restart-warm-cpu-ms")

		s.stop(b)
		warm := s.args
		s.args = append(s.args[:len(s.args):len(s.args)], "--watch-cache-warm-start-revisions=0")
		if updated > 0 {
			s.args = append(s.args, "--watch-cache-history-budget=1")
		}
		defer func() { s.args = warm }()
		t0 = time.Now()
		s.start(b)
		waitCacheReady(ctx, b, hc, base, objects)
		b.ReportMetric(ms(time.Since(t0)), "restart-ready-ms")
		heap, rss = serverMemory(ctx, b, hc, cfg.Host, s.proc.Pid())
		b.ReportMetric(float64(heap)/float64(objects), "drained-heap-B/object")
		b.ReportMetric(float64(liveHeap(ctx, b, hc, cfg.Host))/float64(objects), "drained-live-B/object")
		b.ReportMetric(float64(rss)/(1<<20), "drained-rss-MiB")
		b.ReportMetric(float64(unreturnedHeap(ctx, b, hc, cfg.Host))/(1<<20), "drained-unreturned-MiB")
		saveHeapProfile(ctx, b, hc, cfg.Host, "MEMORY_HEAP_PROFILES", "drained-"+filepath.Base(s.bin)+".pb.gz")
		if updated == 0 {
			return
		}
		// Each server's turn writes a payload of its own letter, so that no
		// update is a no-op on what an earlier turn wrote.
		updates++
		update(ctx, b, versioned.NewForConfigOrDie(cfg), objects, objects*updated/100, l.payload, byte('a'+updates%26))
		// A consistent list is served once the cache holds etcd's revision:
		// every update.
		get(ctx, b, hc, base+"?limit=1")
		heap, _ = serverMemory(ctx, b, hc, cfg.Host, s.proc.Pid())
		b.ReportMetric(float64(heap)/float64(objects), "updated-heap-B/object")
		b.ReportMetric(float64(liveHeap(ctx, b, hc, cfg.Host))/float64(objects), "updated-live-B/object")
		saveHeapProfile(ctx, b, hc, cfg.Host, "MEMORY_HEAP_PROFILES", "updated-"+filepath.Base(s.bin)+".pb.gz")
	}, nil)
}

// update rewrites the payload of n of the objects that load made, picked
// at random with a fixed seed, to letter repeated payload times: the same
// length, so that an updated object costs what it did.
func update(ctx context.Context, b *testing.B, client versioned.Interface, objects, n, payload int, letter byte) {
	picked := rand.New(rand.NewPCG(1, 2)).Perm(objects)[:n]
	patch := []byte(`{"metadata":{"annotations":{"payload":"` + strings.Repeat(string(letter), payload) + `"}}}`)
	writeEach(ctx, b, n, func(ctx context.Context, i int) error {
		ns, name := assignmentAt(picked[i])
		_, err := client.FleetV1beta1().Assignments(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}
