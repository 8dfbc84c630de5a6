package cacher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	testingclock "k8s.io/utils/clock/testing"
)

// restartCache stops c, as a server restart does, and starts a new cache
// over the same etcd with cfg adjusted by adjust.
func restartCache(t *testing.T, c *testCacher, adjust func(*Config)) *Cacher {
	t.Helper()
	cfg := c.cfg
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

			// The fill runs behind readiness, and a watch meanwhile waits
			// for it only up to FreshnessTimeout (3 s), which -race on two
			// busy cores outlasted once in CI. What is asserted here is
			// what the fill holds, so wait for it to end.
			if done := restarted.src.Backfilled(); done != nil {
				select {
				case <-done:
				case <-time.After(wait.ForeverTestTimeout):
					t.Fatal("the warm start's history fill never ended")
				}
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
			} else {
				for _, p := range pods[tc.watchFrom+1:] {
					expectNames(t, w, p.Name)
				}
			}
			// And the cache goes on live. (Stopping a cache whose etcd
			// watch has not started yet leaves clientv3 a stream that holds
			// up the test etcd's shutdown for seconds.)
			after := createPod(t, &testCacher{Cacher: restarted}, "after")
			rv, _ := restarted.cfg.Versioner.ParseResourceVersion(after.ResourceVersion)
			if err := restarted.d.WaitFor(ctx, rv, wait.ForeverTestTimeout, restarted.requestProgress); err != nil {
				t.Fatal(err)
			}
			if !tc.want410 {
				expectNames(t, w, "after")
			}
		})
	}
}

// heldBackfill holds the backfill's list of the old state, the only
// exact-revision list of a full page, until the test ends.
type heldBackfill struct {
	storage.Interface
	release chan struct{}
}

func (h heldBackfill) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	if opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact && opts.Predicate.Limit == source.ListPageSize {
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.Interface.GetList(ctx, key, opts, listObj)
}

// TestWarmStartIsReadyBeforeItsHistory checks that a warm start is ready as
// soon as a cold one, with the current state, and that a watch from before
// the start waits for the history up to FreshnessTimeout, then gets 429 with
// Retry-After if the history is still filling. It used to get the 410 a cold
// cache gives, which made its client re-list though etcd held what it needed.
func TestWarmStartIsReadyBeforeItsHistory(t *testing.T) {
	ctx := context.Background()
	c := newTestCacher(t)
	var pods []*example.Pod
	for i := 0; i < 5; i++ {
		pods = append(pods, createPod(t, c, fmt.Sprintf("p%d", i)))
	}
	clk := testingclock.NewFakeClock(time.Now())
	held := heldBackfill{Interface: c.cfg.Storage, release: make(chan struct{})}
	defer close(held.release)
	restarted := restartCache(t, c, func(cfg *Config) {
		cfg.Storage = held
		cfg.Clock = clk
	})
	list := &example.PodList{}
	if err := restarted.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, list); err != nil || len(list.Items) != len(pods) {
		t.Fatalf("list while the history fills: %d items, %v; want %d", len(list.Items), err, len(pods))
	}
	type result struct {
		w   watch.Interface
		err error
	}
	done := make(chan result, 1)
	go func() {
		w, err := restarted.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: pods[1].ResourceVersion, Recursive: true, Predicate: storage.Everything})
		done <- result{w, err}
	}()
	var r result
	testkit.StepUntil(t, clk, func() bool {
		select {
		case r = <-done:
			return true
		default:
			return false
		}
	})
	// Not a 410, which would make the client re-list though etcd still
	// holds the history: 429, and the client's retry finds it filled.
	if !apierrors.IsTooManyRequests(r.err) {
		if r.w != nil {
			r.w.Stop()
		}
		t.Fatalf("watch from before the start while its history fills: got %v, want 429", r.err)
	}
	if seconds, ok := apierrors.SuggestsClientDelay(r.err); !ok || seconds < 1 {
		t.Errorf("429 without Retry-After: %v", r.err)
	}
}
