package bench

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// BenchmarkConcurrentLists measures full lists served at once: the memory
// they add to the server's RSS and the time until the last one was read,
// at the storage version (the cached bytes) and at v1alpha1 (decoded,
// converted and encoded). Before them it times lists one at a time: a
// consistent one, and the two that decode every object in ours, a Table in
// pages of 500 and a v1alpha1 list. Like BenchmarkWatchListWrites it loads one etcd
// once, then runs each server over it in turn, round after round: a
// same-run A/B of a flag needs LISTS_ALT=<a script running ours with it>.
//
// LISTS_OBJECTS (100,000) sizes it; LISTS_ROUNDS (3) repeats it;
// LISTS_IMPLS and LISTS_ALT pick the servers as WATCHLIST_IMPLS and
// WATCHLIST_ALT do. BENCH_PROFILE_DIR saves each server's CPU profile of
// BENCH_PROFILE_SECONDS (2) of lists, one after another, first: where a
// list's time goes, gzip and TLS included. BENCH_PROFILE_LIST picks the
// list: consistent (the default), table500 or v1alpha1.
func BenchmarkConcurrentLists(b *testing.B) {
	l := newLoaded(b, "LISTS", 100_000)
	l.takeTurns(b, func(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, s *scaleServer) {
		if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
			kind := profiledList(b)
			n := profileLists(ctx, b, cfg, hc, base, kind, filepath.Join(dir, fmt.Sprintf("lists-%s-%s-%d.pprof", kind.name, filepath.Base(s.bin), s.proc.Pid())))
			b.ReportMetric(float64(n), "profiled-lists")
		}
		reportListLatencies(ctx, b, hc, base, s.proc.Pid(), []listKind{{name: "consistent"}, tableList, v1alpha1List})
		_, rss := serverMemory(ctx, b, hc, cfg.Host, s.proc.Pid())
		for _, run := range []struct {
			version string
			n       int
		}{{"v1beta1", 8}, {"v1beta1", 32}, {"v1alpha1", 8}} {
			url := strings.Replace(base, "/v1beta1/", "/"+run.version+"/", 1)
			added, took := concurrentListsRSS(ctx, b, hc, url, s.proc.Pid(), run.n)
			b.ReportMetric(float64(added)/float64(rss)*100, fmt.Sprintf("rss-added-%dlists-%s-%%", run.n, run.version))
			b.ReportMetric(ms(took), fmt.Sprintf("%dlists-%s-all-ms", run.n, run.version))
		}
	}, nil)
}

// profiledList is the kind of list BENCH_PROFILE_LIST names.
func profiledList(b *testing.B) listKind {
	for _, k := range []listKind{{name: "consistent"}, tableList, v1alpha1List} {
		if k.name == cmp.Or(os.Getenv("BENCH_PROFILE_LIST"), "consistent") {
			return k
		}
	}
	b.Fatalf("BENCH_PROFILE_LIST=%q: want consistent, table500 or v1alpha1", os.Getenv("BENCH_PROFILE_LIST"))
	return listKind{}
}

// profileLists lists base in a loop, one list of kind at a time, while the
// server takes a CPU profile into path, and returns how many lists it
// served.
func profileLists(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, kind listKind, path string) int {
	done := make(chan struct{})
	go func() {
		defer close(done)
		profile(ctx, cfg, "profile", path)
	}()
	for n := 0; ; n++ {
		select {
		case <-done:
			return n
		default:
			listAll(ctx, b, hc, kind.url(base), kind.query, cmp.Or(kind.accept, "application/json"))
		}
	}
}
