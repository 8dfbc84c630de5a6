package bench

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// BenchmarkWatchListWrites measures one figure of BenchmarkScale on its
// own, and more often: the writes' p99 beside concurrent watch-lists,
// against the same writes alone. It loads one etcd once, then runs each
// server over it in turn, round after round, so that the servers are
// compared on the same data, interleaved in time: about 4 minutes a
// round of three servers, where BenchmarkScale takes twenty a repeat.
// make bench-watchlist-writes runs it.
//
// WATCHLIST_OBJECTS (10,000) and WATCHLIST_CLIENTS (100) size it;
// WATCHLIST_ROUNDS (3) repeats it; WATCHLIST_IMPLS=ours leaves upstream
// out; WATCHLIST_ALT=path,… adds server binaries, impl=alt=<file name>,
// for an A/B of a change against ours. WATCHLIST_VERSION=v1alpha1 has the
// watch-lists ask for a version other than the storage version's, which
// the servers convert and encode.
// BENCH_PROBES adds figures that tell where the writes' time goes
// (probe_bench_test.go). BENCH_TRACE_DIR saves a runtime trace of each server as its
// watch-lists start, for go tool trace, of BENCH_PROFILE_SECONDS (2).
func BenchmarkWatchListWrites(b *testing.B) {
	clients := testkit.EnvInt("WATCHLIST_CLIENTS", 100)
	l := newLoaded(b, "WATCHLIST", 10_000)
	l.takeTurns(b, func(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, s *scaleServer) {
		watchListRun(ctx, b, cfg, hc, base, watchListOpts{clients: clients, warmUp: true, etcdURL: l.etcdURL,
			kubeconfig: s.kubeconfig, version: os.Getenv("WATCHLIST_VERSION")})
	}, func(ctx context.Context, b *testing.B) {
		// The next server streams the same objects: without this, each
		// run's writes would add to every later run's watch-lists.
		if _, err := l.etcd.Delete(ctx, assignmentsKey+"writes/", clientv3.WithPrefix()); err != nil {
			b.Fatal(err)
		}
	})
}

// loaded is one etcd loaded once with objects of 1 KiB, which each server
// of a same-run A/B serves in turn.
type loaded struct {
	etcd    *clientv3.Client
	etcdURL string
	dir     string
	// objects were loaded, of payload bytes each; impls take turns, rounds
	// times.
	objects, payload, rounds int
	impls                    []serverBinary
}

// newLoaded starts an etcd and loads it through the first server, as the
// environment variables named with prefix say: <prefix>_OBJECTS objects
// (objects unless set) of a <prefix>_PAYLOAD-byte annotation (1024), for
// <prefix>_ROUNDS (3) rounds of the servers <prefix>_IMPLS and <prefix>_ALT
// pick (serverBinaries).
func newLoaded(b *testing.B, prefix string, objects int) *loaded {
	l := newUnloaded(b, prefix, objects)
	l.etcdURL = startScaleEtcd(b, l.dir)
	l.etcd = etcdClient(b, l.etcdURL)
	s, cfg := l.server(b, "load", l.impls[0].bin)
	load(context.Background(), b, versioned.NewForConfigOrDie(cfg), scaleSize{objects: l.objects, payload: l.payload})
	s.stop(b)
	return l
}

// newUnloaded is newLoaded's sizes and servers, before any etcd runs.
func newUnloaded(b *testing.B, prefix string, objects int) *loaded {
	return &loaded{dir: b.TempDir(), objects: testkit.EnvInt(prefix+"_OBJECTS", objects), payload: testkit.EnvInt(prefix+"_PAYLOAD", 1024),
		rounds: testkit.EnvInt(prefix+"_ROUNDS", 3), impls: serverBinaries(b, prefix+"_IMPLS", prefix+"_ALT")}
}

// etcdClient is a client of the etcd at url, closed when the benchmark ends.
func etcdClient(b *testing.B, url string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// server starts bin over the loaded etcd, keeping its files under impl's
// name, and returns it once it serves.
func (l *loaded) server(b *testing.B, impl, bin string) (*scaleServer, *rest.Config) {
	s := newScaleServer(b, bin, filepath.Join(l.dir, impl), l.etcdURL)
	s.start(b)
	return s, waitServing(context.Background(), b, s.kubeconfig)
}

// takeTurns runs each server over the loaded etcd in turn, for the
// rounds (eachTurn): run measures it once its cache holds every object,
// and after, if set, cleans up once it stopped.
func (l *loaded) takeTurns(b *testing.B,
	run func(ctx context.Context, b *testing.B, cfg *rest.Config, hc *http.Client, base string, s *scaleServer),
	after func(ctx context.Context, b *testing.B)) {
	l.eachTurn(b, func(b *testing.B, impl serverBinary) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s, cfg := l.server(b, impl.name, impl.bin)
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			b.Fatal(err)
		}
		base := cfg.Host + assignmentsPath
		waitCacheReady(ctx, b, hc, base, l.objects)
		run(ctx, b, cfg, hc, base, s)
		s.stop(b)
		if after != nil {
			after(ctx, b)
		}
	})
}

// eachTurn runs turn for each server, for the rounds, as a sub-benchmark
// impl=<name> of b: repeated names get go test's #01, #02 suffixes, which
// benchtable reads as repeats of one scenario.
func (l *loaded) eachTurn(b *testing.B, turn func(b *testing.B, impl serverBinary)) {
	for range l.rounds {
		for _, impl := range l.impls {
			b.Run("impl="+impl.name, func(b *testing.B) {
				for range b.N {
					turn(b, impl)
				}
			})
		}
	}
}

// assignmentsPath is the Assignments of every namespace, at the storage
// version; assignmentsKey is where etcd holds them.
const (
	assignmentsPath = "/apis/fleet.example.com/v1beta1/assignments"
	assignmentsKey  = "/registry/fleet.example.com/assignments/"
)
