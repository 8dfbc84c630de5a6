package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// TestAggregatedReplicaLoss runs two replicas of our server behind the
// APIService's Service and loses the one the aggregator's connections go
// to while an informer and a kubectl watch run through the aggregator. The
// informer goes on through the other replica and ends with every object;
// kubectl's watch goes on or ends, never hangs.
//
//   - stopped: the replica shuts down as on SIGTERM, ending its watches
//     cleanly. The informer resumes from its last resourceVersion: no re-list.
//   - killed: its connections are reset, as when its node dies. The
//     aggregator then ends the proxied watch with an HTTP/2 stream error,
//     and client-go's reflector answers any watch error by syncing again
//     (a re-list, or a watch-list), whatever the server. Asserted as such:
//     it is the aggregator's and client-go's doing, and costs one sync.
func TestAggregatedReplicaLoss(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lose      func(a *aggregatedServer, lb *testkit.Balancer, i int)
		wantSyncs int32
	}{
		{"stopped", func(a *aggregatedServer, _ *testkit.Balancer, i int) { a.replicas[i].stop() }, 1},
		{"killed", func(_ *aggregatedServer, lb *testkit.Balancer, i int) { lb.Lose(i) }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) { testReplicaLoss(t, tc.lose, tc.wantSyncs) })
	}
}

func testReplicaLoss(t testing.TB, lose func(*aggregatedServer, *testkit.Balancer, int), wantSyncs int32) {
	a, lb := startAggregatedReplicas(t, 2)
	s := a.Front
	const ns = "replica-loss"
	client := s.Client.FleetV1beta1().Assignments(ns)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var syncs atomic.Int32
	// trace says what the reflector did, so that a failure says why it
	// synced again: the call that failed, or the watch that ended before it.
	trace := &callTrace{start: time.Now()}
	inf := cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			// KUBE_WATCHLIST_INCONSISTENCY_DETECTOR's check after a
			// watch-list lists at its exact resourceVersion; that is no sync.
			if opts.ResourceVersionMatch != metav1.ResourceVersionMatchExact {
				syncs.Add(1)
			}
			list, err := client.List(ctx, opts)
			trace.add("list rv=%q match=%q: err=%v", opts.ResourceVersion, opts.ResourceVersionMatch, err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
				syncs.Add(1)
			}
			w, err := client.Watch(ctx, opts)
			n := trace.add("watch rv=%q sendInitialEvents=%v: err=%v", opts.ResourceVersion, opts.SendInitialEvents != nil, err)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				if ev.Type == watch.Error {
					trace.add("watch %d: error event %v", n, ev.Object)
				} else {
					trace.add("watch %d: %s", n, ev.Type)
				}
				return ev, true
			}), nil
		},
	}, &v1beta1.Assignment{}, 0, cache.Indexers{})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("the informer never synced")
	}

	k := newKubectl(t, s)
	cmd := k.command(ctx, "get", "asg", "-n", ns, "--watch", "--output-watch-events")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := linesOf(stdout)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	create := func(name string) {
		t.Helper()
		// The first request after the loss may meet the aggregator's broken
		// connection (503); clients retry, as this does.
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := client.Create(ctx, &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: v1beta1.AssignmentSpec{AgentName: "agent-1"}}, metav1.CreateOptions{})
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
	}
	create("before")
	for line := range lines {
		if strings.HasPrefix(line, "ADDED") && strings.Contains(line, "before") {
			break
		}
	}

	lose(a, lb, lb.Busiest())
	for i := 0; i < 5; i++ {
		create(fmt.Sprintf("after-%d", i))
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(inf.GetStore().List()) == 6, nil
	}); err != nil {
		t.Fatalf("the informer holds %d of 6 objects after the replica was lost", len(inf.GetStore().List()))
	}
	if n := syncs.Load(); n != wantSyncs {
		t.Errorf("the informer synced %d times, want %d; what it did:\n%s", n, wantSyncs, trace)
	}

	// kubectl either goes on printing the new objects (its watch went to
	// the other replica) or exits; it must not hang. kubectl get --watch
	// does not resume a watch that ends and exits 0 however it ended
	// (get.go drops UntilWithoutRetry's error), so the exit status says
	// nothing here; only a hang is a failure.
	deadline := time.After(30 * time.Second)
	for wentOn := false; !wentOn; {
		select {
		case line, ok := <-lines:
			if !ok {
				err := <-exited
				t.Logf("kubectl's watch ended (exit: %v): %s", err, strings.TrimSpace(stderr.String()))
				wentOn = true
				continue
			}
			t.Logf("kubectl: %s", line)
			wentOn = strings.Contains(line, "after-4")
		case <-deadline:
			t.Fatalf("kubectl's watch neither ended nor went on after its replica was lost; stderr: %s", stderr.String())
		}
	}
	mustContain(t, k.run(t, "get", "asg", "-n", ns), "before", "after-4")
}

// callTrace is a numbered log of a reflector's calls and events, each with
// the time since start.
type callTrace struct {
	start time.Time
	// mu guards lines.
	mu    sync.Mutex
	lines []string
}

// add logs a line and returns its number.
func (c *callTrace) add(format string, args ...any) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, fmt.Sprintf("%d %6.3fs ", len(c.lines), time.Since(c.start).Seconds())+fmt.Sprintf(format, args...))
	return len(c.lines) - 1
}

func (c *callTrace) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}
