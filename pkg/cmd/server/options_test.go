package server

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	genericfeatures "k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string // empty: valid
	}{
		{name: "defaults"},
		{name: "aggregated", args: []string{"--mode=aggregated"}},
		{name: "unknown mode", args: []string{"--mode=cluster"}, wantErr: `--mode must be "standalone" or "aggregated", not "cluster"`},
		{name: "cache off for one resource", args: []string{"--watch-cache-sizes=assignments.fleet.example.com#0,agents.fleet.example.com#100"}},
		{name: "size without resource separator", args: []string{"--watch-cache-sizes=assignments.fleet.example.com"},
			wantErr: "--watch-cache-sizes: invalid value of watch cache size: assignments.fleet.example.com (want resource.group#size"},
		{name: "size not a number", args: []string{"--watch-cache-sizes=assignments.fleet.example.com#none"},
			wantErr: "--watch-cache-sizes: invalid size of watch cache size"},
		{name: "no HTTPS port", args: []string{"--secure-port=0"},
			wantErr: "--secure-port 0 must be between 1 and 65535, inclusive. It cannot be turned off with 0"},
		{name: "unknown etcd log level", args: []string{"--embedded-etcd-log-level=loud"},
			wantErr: `--embedded-etcd-log-level must be debug, info, warn or error, not "loud"`},
		{name: "etcd log level", args: []string{"--embedded-etcd-log-level=warn"}},
		{name: "consistency check off", args: []string{"--watch-cache-consistency-check-interval=0"}},
		{name: "negative consistency check interval", args: []string{"--watch-cache-consistency-check-interval=-1m"},
			wantErr: "--watch-cache-consistency-check-interval must be 0 (off) or positive, not -1m0s"},
		{name: "cold start", args: []string{"--watch-cache-warm-start-revisions=0"}},
		{name: "negative warm start", args: []string{"--watch-cache-warm-start-revisions=-5"},
			wantErr: "--watch-cache-warm-start-revisions must be 0 (off) or positive, not -5"},
		{name: "history budget", args: []string{"--watch-cache-history-budget=64Mi"}},
		{name: "no history budget", args: []string{"--watch-cache-history-budget=0"}},
		{name: "negative history budget", args: []string{"--watch-cache-history-budget=-1Gi"},
			wantErr: "--watch-cache-history-budget must be 0 (no budget) or positive, not -1Gi"},
		{name: "initial events concurrency", args: []string{"--watch-cache-initial-events-concurrency=4"}},
		{name: "no initial events bound", args: []string{"--watch-cache-initial-events-concurrency=0"}},
		{name: "negative initial events concurrency", args: []string{"--watch-cache-initial-events-concurrency=-2"},
			wantErr: "--watch-cache-initial-events-concurrency must be 0 (no bound) or positive, not -2"},
		{name: "compression", args: []string{"--watch-cache-compression=s2"}},
		{name: "no compression", args: []string{"--watch-cache-compression=off"}},
		{name: "zstd compression", args: []string{"--watch-cache-compression=zstd"},
			wantErr: `--watch-cache-compression must be "off" or "s2", not "zstd" (zstd is not offered: it decompresses too slowly)`},
		{name: "no watch limit", args: []string{"--max-watches=0"}},
		{name: "negative watch limit", args: []string{"--max-watches=-1"},
			wantErr: "--max-watches must be 0 (no limit) or positive, not -1"},
		{name: "negative size", args: []string{"--watch-cache-sizes=assignments.fleet.example.com#-1"},
			wantErr: "--watch-cache-sizes: watch cache size cannot be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions(io.Discard)
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(append([]string{"--data-dir=" + t.TempDir()}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want no error", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestWatchCacheFlagsReachTheCache parses the watch-cache flags and checks
// each reaches the options every resource's cache is built from, and from
// there its Config (pkg/apiserver's TestCacheConfig takes the second step).
func TestWatchCacheFlagsReachTheCache(t *testing.T) {
	o := NewOptions(io.Discard)
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{
		"--watch-cache-history-budget=64Mi",
		"--watch-cache-warm-start-revisions=7",
		"--watch-cache-consistency-check-interval=42s",
		"--watch-cache-consistent-read-fallback",
		"--watch-cache-initial-events-concurrency=5",
		"--watch-cache-compression=s2",
		"--watch-cache=false",
	}); err != nil {
		t.Fatal(err)
	}
	got := o.watchCacheOptions(nil)
	for _, c := range []struct {
		flag      string
		got, want any
	}{
		{"--watch-cache-history-budget", got.HistoryBudget, int64(64 << 20)},
		{"--watch-cache-warm-start-revisions", got.WarmStartRevisions, int64(7)},
		{"--watch-cache-consistency-check-interval", got.ConsistencyCheckInterval, 42 * time.Second},
		{"--watch-cache-consistent-read-fallback", got.ConsistentReadFallback, true},
		{"--watch-cache-initial-events-concurrency", got.InitialEventsConcurrency, 5},
		{"--watch-cache-compression", got.Compression, cacher.CompressionS2},
		{"--watch-cache", got.Enabled, false},
	} {
		if c.got != c.want {
			t.Errorf("%s: the cache gets %v, want %v", c.flag, c.got, c.want)
		}
	}
}

// TestWatchesOffChainStack checks that ours turns APIServingWithRoutine on
// unless --feature-gates names it, and that the benchmark's upstream wiring,
// which clears WatchesOffChainStack, keeps the generic server's default.
func TestWatchesOffChainStack(t *testing.T) {
	gate := string(genericfeatures.APIServingWithRoutine)
	t.Cleanup(func() { _ = utilfeature.DefaultMutableFeatureGate.Set(gate + "=false") })
	for _, tc := range []struct {
		name     string
		args     []string
		upstream bool
		want     bool
	}{
		{name: "ours", want: true},
		{name: "upstream's wiring", upstream: true, want: false},
		{name: "turned off by flag", args: []string{"--feature-gates=" + gate + "=false"}, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := utilfeature.DefaultMutableFeatureGate.Set(gate + "=false"); err != nil {
				t.Fatal(err)
			}
			o := NewOptions(io.Discard)
			o.WatchesOffChainStack = !tc.upstream
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := o.ServerRun.ComponentGlobalsRegistry.Set(); err != nil {
				t.Fatal(err)
			}
			if err := o.serveWatchesOffChainStack(); err != nil {
				t.Fatal(err)
			}
			if got := utilfeature.DefaultFeatureGate.Enabled(genericfeatures.APIServingWithRoutine); got != tc.want {
				t.Errorf("APIServingWithRoutine = %v, want %v", got, tc.want)
			}
		})
	}
}
