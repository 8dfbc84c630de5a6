package cacher

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
)

// secondCache lets another cache use the etcd3 store, which takes a size
// estimator once: as a restarted server, it has its own.
type secondCache struct{ storage.Interface }

func (secondCache) EnableResourceSizeEstimation(storage.KeysFunc) error { return nil }

// restartCache stops c, as a server restart does, and starts a new cache
// over the same etcd with cfg adjusted by adjust.
func restartCache(t *testing.T, c *testCacher, adjust func(*Config)) *Cacher {
	t.Helper()
	cfg := c.cfg
	cfg.Storage = secondCache{cfg.Storage}
	c.Stop()
	if adjust != nil {
		adjust(&cfg)
	}
	restarted, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Stop)
	waitReady(t, restarted)
	return restarted
}

// TestWarmStart checks that a cache started over existing history serves a
// watch from a resourceVersion older than its start: warm, it replays the
// events after it; cold, as upstream's cache, it can only answer 410.
func TestWarmStart(t *testing.T) {
	tests := []struct {
		name      string
		revisions int64
		// compactTo compacts etcd at the nth pod's revision before the restart, if > 0.
		compactTo int
		// watchFrom is the pod whose resourceVersion the client resumes from.
		watchFrom int
		want410   bool
	}{
		{name: "warm", watchFrom: 1},
		{name: "cold", revisions: -1, watchFrom: 1, want410: true},
		{name: "warm, bounded by revisions", revisions: 3, watchFrom: 1, want410: true},
		{name: "warm, from within the revision bound", revisions: 3, watchFrom: 4},
		{name: "warm, bounded by a compaction the store never saw", compactTo: 3, watchFrom: 1, want410: true},
		{name: "warm, from after the compaction", compactTo: 3, watchFrom: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := newTestCacher(t)
			var pods []*example.Pod
			for i := 0; i < 6; i++ {
				pods = append(pods, createPod(t, c, fmt.Sprintf("p%d", i)))
			}
			if tc.compactTo > 0 {
				rv, _ := c.cfg.Versioner.ParseResourceVersion(pods[tc.compactTo].ResourceVersion)
				if _, err := c.client.Compact(ctx, int64(rv)); err != nil {
					t.Fatal(err)
				}
			}
			restarted := restartCache(t, c, func(cfg *Config) {
				if tc.revisions != 0 {
					cfg.WarmStartRevisions = tc.revisions
				}
			})
			// The restarted cache holds the current state, whatever it replayed.
			list := &example.PodList{}
			if err := restarted.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, list); err != nil || len(list.Items) != len(pods) {
				t.Fatalf("list after restart: %d items, %v; want %d", len(list.Items), err, len(pods))
			}

			from := pods[tc.watchFrom].ResourceVersion
			w, err := restarted.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: from, Recursive: true, Predicate: storage.Everything})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			if tc.want410 {
				ev := next(t, w)
				if ev.Type != watch.Error || ev.Object.(*metav1.Status).Code != 410 {
					t.Fatalf("watch from %s: got %s %v, want 410", from, ev.Type, ev.Object)
				}
				return
			}
			for _, p := range pods[tc.watchFrom+1:] {
				expectNames(t, w, p.Name)
			}
			// And the stream goes on live.
			createPod(t, &testCacher{Cacher: restarted}, "after")
			expectNames(t, w, "after")
		})
	}
}

// TestWarmStartWaitsForReplay checks that a warm-starting cache is not
// ready, and answers 429, until it has replayed up to the revision etcd had
// when it started.
func TestWarmStartWaitsForReplay(t *testing.T) {
	ctx := context.Background()
	c := newTestCacher(t)
	var last *example.Pod
	for i := 0; i < 20; i++ {
		last = createPod(t, c, fmt.Sprintf("p%d", i))
	}
	cfg := c.cfg
	c.Stop()
	// The replay never arrives: the restarted cache's watch is silent.
	held := &faultyStore{Interface: secondCache{cfg.Storage}}
	held.startSilent.Store(true)
	cfg.Storage = held
	restarted, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Stop()
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return held.count() > 0, nil }); err != nil {
		t.Fatal(err)
	}
	since, head := restarted.log.bounds()
	rv, _ := c.cfg.Versioner.ParseResourceVersion(last.ResourceVersion)
	if since >= rv || head >= rv {
		t.Fatalf("the warm list is at %d..%d, want before %d", since, head, rv)
	}
	if err := restarted.ReadinessCheck(); err == nil {
		t.Fatal("ready before replaying the history")
	}
	if err := restarted.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, &example.PodList{}); err == nil {
		t.Fatal("served a list before replaying the history")
	}
}
