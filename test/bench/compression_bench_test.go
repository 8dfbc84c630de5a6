package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/internal/corpus"
	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// BenchmarkCompression is issue 67's measure of objects compressed at
// rest, on objects shaped like a real cluster's (internal/corpus): our
// server with --watch-cache-compression=off and =s2 and upstream's take
// turns over one etcd loaded once with COMPRESSION_OBJECTS (100,000)
// Assignments of the realistic corpus (COMPRESSION_CORPUS=random: random
// bytes of the same sizes, in an annotation), written straight into etcd.
// For each turn, COMPRESSION_ROUNDS (3) rounds:
//
//   - the heap in use above the same server's over an empty etcd, per
//     object and as a share of the objects' JSON, measured once the warm
//     start's backfills ended (waitBackfilled) and with no list in the
//     25 s before (the packer's first pass runs at ready, and no gzip run
//     a list kept hides in the figure);
//   - a full list at resourceVersion 0 with gzip, as client-go asks for
//     it, the first (which shares no run) and the median of 3 after; a
//     full list without gzip; a consistent list in pages of 500, gzip;
//   - watch delivery: 10 watchers of every Assignment, 300 patches 10 ms
//     apart to objects compressed by then; the p50 and p99 from a patch's
//     request to its event at each watcher, and the server's CPU per
//     event delivered.
//
// COMPRESSION_IMPLS picks among off, s2 and upstream, and alt-off and
// alt-s2, the binary COMPRESSION_ALT names with the same flag;
// COMPRESSION_HEAP_PROFILES=dir keeps each server's heap profile of the
// last round, where the heap is measured.
func BenchmarkCompression(b *testing.B) {
	objects := testkit.EnvInt("COMPRESSION_OBJECTS", 100_000)
	rounds := testkit.EnvInt("COMPRESSION_ROUNDS", 3)
	random := os.Getenv("COMPRESSION_CORPUS") == "random"
	bins := build(b)
	dir := b.TempDir()
	etcdURL := startScaleEtcd(b, dir)
	etcd := etcdClient(b, etcdURL)
	type impl struct{ name, bin, flag string }
	var impls []impl
	for _, name := range strings.Split(cmp.Or(os.Getenv("COMPRESSION_IMPLS"), "off,s2,upstream"), ",") {
		switch alt, isAlt := strings.CutPrefix(name, "alt-"); {
		case name == "off" || name == "s2":
			impls = append(impls, impl{name, filepath.Join(bins, "ours"), "--watch-cache-compression=" + name})
		case isAlt && (alt == "off" || alt == "s2"):
			// Another build of ours, as MILLION_ALT: before and after a change, in one run.
			bin := os.Getenv("COMPRESSION_ALT")
			if bin == "" {
				b.Fatalf("%s needs COMPRESSION_ALT, the binary of the other build", name)
			}
			impls = append(impls, impl{name, bin, "--watch-cache-compression=" + alt})
		default:
			impls = append(impls, impl{name, filepath.Join(bins, name), ""})
		}
	}
	serve := func(b *testing.B, im impl) (*scaleServer, *rest.Config, *http.Client) {
		s := newScaleServer(b, im.bin, filepath.Join(dir, im.name), etcdURL)
		if im.flag != "" {
			s.args = append(s.args, im.flag)
		}
		s.start(b)
		cfg := waitServing(context.Background(), b, s.kubeconfig)
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			b.Fatal(err)
		}
		return s, cfg, hc
	}
	// The empty server's heap, each: what the objects add is above it.
	empty := map[string]int64{}
	for _, im := range impls {
		s, cfg, hc := serve(b, im)
		empty[im.name], _ = serverMemory(context.Background(), b, hc, cfg.Host, s.proc.Pid())
		s.stop(b)
	}
	jsonBytes := loadCorpus(context.Background(), b, etcd, objects, random)
	b.Logf("%d Assignments, %d bytes of JSON in etcd, %d a mean", objects, jsonBytes, jsonBytes/int64(objects))

	for range rounds {
		for _, im := range impls {
			b.Run("impl="+im.name, func(b *testing.B) {
				for range b.N {
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					s, cfg, hc := serve(b, im)
					base := cfg.Host + assignmentsPath
					waitCacheReady(ctx, b, hc, base, objects)
					ready := time.Now()
					waitBackfilled(ctx, b, hc, cfg.Host)
					b.Logf("%s: backfills ended %v after the cache was ready", im.name, time.Since(ready).Round(time.Millisecond))
					time.Sleep(25 * time.Second) // no list in the last 20 s: see the doc comment
					heap, rss := serverMemory(ctx, b, hc, cfg.Host, s.proc.Pid())
					above := heap - empty[im.name]
					b.ReportMetric(float64(above)/float64(objects), "heap-above-empty-B/object")
					b.ReportMetric(float64(above)/float64(jsonBytes), "heap-above-empty/json")
					b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")
					saveHeapProfile(ctx, b, hc, cfg.Host, "COMPRESSION_HEAP_PROFILES", im.name+".pb.gz")

					list := func(url, encoding string) time.Duration {
						t0 := time.Now()
						req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
						req.Header.Set("Accept", "application/json")
						req.Header.Set("Accept-Encoding", encoding)
						resp, err := hc.Do(req)
						if err != nil {
							b.Fatal(err)
						}
						defer resp.Body.Close()
						if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
							b.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
						}
						return time.Since(t0)
					}
					at0 := base + "?resourceVersion=0"
					b.ReportMetric(ms(list(at0, "gzip")), "first-gzip-list-ms")
					b.ReportMetric(ms(median3(func() time.Duration { return list(at0, "gzip") })), "gzip-list-ms")
					b.ReportMetric(ms(median3(func() time.Duration { return list(at0, "identity") })), "list-ms")
					b.ReportMetric(ms(median3(func() time.Duration {
						t0 := time.Now()
						client := versioned.NewForConfigOrDie(cfg)
						opts := metav1.ListOptions{Limit: 500}
						for {
							l, err := client.FleetV1beta1().Assignments("").List(ctx, opts)
							if err != nil {
								b.Fatal(err)
							}
							if opts.Continue = l.Continue; opts.Continue == "" {
								return time.Since(t0)
							}
						}
					})), "pages-of-500-ms")

					p50, p99, cpu := watchDelivery(ctx, b, cfg, hc, base, s.proc.Pid(), objects)
					b.ReportMetric(ms(p50), "delivery-p50-ms")
					b.ReportMetric(ms(p99), "delivery-p99-ms")
					b.ReportMetric(float64(cpu.Microseconds()), "cpu-us/event")
					s.stop(b)
				}
			})
		}
	}
}

// median3 returns the median of three runs of f.
func median3(f func() time.Duration) time.Duration {
	d := []time.Duration{f(), f(), f()}
	slices.Sort(d)
	return d[1]
}

// loadCorpus writes n Assignments of the realistic corpus, or random bytes
// of its sizes as an annotation, straight into etcd, named as
// assignmentAt names them, 128 to a transaction, and returns their JSON's
// bytes.
func loadCorpus(ctx context.Context, b *testing.B, etcd *clientv3.Client, n int, random bool) int64 {
	var total int64
	const perTxn, seed = 128, 67
	g := corpus.New(seed)
	rnd := corpus.Random(seed, 1024)
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := range n {
		a := g.Assignment()
		a.Namespace, a.Name = assignmentAt(i)
		a.ResourceVersion, a.UID = "", types.UID(fmt.Sprintf("uid-%08d", i))
		if random {
			a.Annotations = map[string]string{"payload": string(bytes.ToValidUTF8(rnd[i%len(rnd)], []byte("?")))}
			a.ManagedFields, a.Labels = nil, nil
		}
		raw := corpus.JSON(a)
		total += int64(len(raw))
		ops = append(ops, clientv3.OpPut(assignmentsKey+a.Namespace+"/"+a.Name, string(raw)))
		if len(ops) == perTxn {
			flush()
		}
	}
	flush()
	return total
}

// watchDelivery opens 10 watches of every Assignment, patches 300 of the
// loaded objects 10 ms apart, and returns the p50 and p99 from each
// patch's request to its event at each watcher, and the server's CPU per
// event delivered.
func watchDelivery(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, pid, objects int) (p50, p99, cpuPerEvent time.Duration) {
	const watchers, writes = 10, 300
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	sent := map[string]time.Time{} // name → when its patch was asked
	var lat []time.Duration
	var wg sync.WaitGroup
	ready := make(chan struct{}, watchers)
	for range watchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := getStream(ctx, b, hc, base+"?watch=1&allowWatchBookmarks=false&sendInitialEvents=false&resourceVersionMatch=NotOlderThan")
			defer resp.Body.Close()
			ready <- struct{}{}
			r := bufio.NewReaderSize(resp.Body, 1<<20)
			for {
				line, err := r.ReadBytes('\n')
				if err != nil {
					return
				}
				at := time.Now()
				name := nameIn(line)
				mu.Lock()
				if t0, ok := sent[name]; ok {
					lat = append(lat, at.Sub(t0))
				}
				mu.Unlock()
			}
		}()
	}
	for range watchers {
		<-ready
	}
	client := versioned.NewForConfigOrDie(cfg)
	cpu0, _ := procStats(b, pid)
	picked := rand.New(rand.NewPCG(7, 7)).Perm(objects)[:writes]
	// A value of this turn's own: a patch that changed nothing would be
	// no write, and no event.
	turn := time.Now().UnixNano()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i, at := range picked {
		<-tick.C
		ns, name := assignmentAt(at)
		mu.Lock()
		sent[name] = time.Now()
		mu.Unlock()
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"bench-write":"w%d-%d"}}}`, turn, i)
		if _, err := client.FleetV1beta1().Assignments(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	// Every event reaches every watcher, or the wait ends.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(lat)
		mu.Unlock()
		if n >= watchers*writes {
			break
		}
		time.Sleep(10 * time.Millisecond) // polled: the watchers signal nothing per event
	}
	cpu1, _ := procStats(b, pid)
	cancel()
	wg.Wait()
	if len(lat) < watchers*writes {
		b.Fatalf("%d deliveries, want %d", len(lat), watchers*writes)
	}
	return percentile(lat, 0.5), percentile(lat, 0.99), (cpu1 - cpu0) / time.Duration(len(lat))
}

// nameIn returns the name of the object of a watch event's line.
func nameIn(line []byte) string {
	_, rest, ok := bytes.Cut(line, []byte(`"metadata":{"name":"`))
	if !ok {
		return ""
	}
	name, _, _ := bytes.Cut(rest, []byte(`"`))
	return string(name)
}

// waitBackfilled waits, up to 10 minutes, until every warm start's
// backfill the server started has ended (filled, given up or abandoned):
// at a million objects the replay may still run 25 s after the cache is
// ready, and its etcd responses, state and events would count in the heap
// as the cache's. A server without the metric (upstream's) has none.
func waitBackfilled(ctx context.Context, b *testing.B, hc *http.Client, host string) {
	b.Helper()
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		var started, ended float64
		for _, line := range strings.Split(string(get(ctx, b, hc, host+"/metrics")), "\n") {
			if !strings.HasPrefix(line, "cached_apiserver_watch_cache_backfills_total{") {
				continue
			}
			_, value, _ := strings.Cut(line, "} ")
			n, _ := strconv.ParseFloat(strings.TrimSpace(value), 64)
			switch {
			case strings.Contains(line, `result="started"`):
				started += n
			case strings.Contains(line, `result="filled"`), strings.Contains(line, `result="given_up"`),
				strings.Contains(line, `result="abandoned"`):
				ended += n
			}
		}
		return ended >= started, nil
	})
	if err != nil {
		b.Fatalf("backfills still running 10 minutes after the cache was ready: %v", err)
	}
}
