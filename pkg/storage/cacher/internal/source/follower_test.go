package source

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// TestWaitToRewatch checks that while the follower waits to re-open its etcd
// watch, a request through it that etcd answered, proof that etcd has a
// leader again, makes it try after the minimum delay instead of its backoff,
// and that an answer from before the wait does not.
func TestWaitToRewatch(t *testing.T) {
	tests := []struct {
		name string
		// before and during signal an answer before and during the wait.
		before, during bool
		wantEarly      bool
	}{
		{name: "no answer waits out the delay"},
		{name: "an answer during the wait cuts it short", during: true, wantEarly: true},
		{name: "an answer from before the wait proves nothing", before: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := testingclock.NewFakeClock(time.Now())
			f := newFollower(Config{Clock: clk}, nil)
			if tc.before {
				_ = f.answer(nil)
			}
			done := make(chan error, 1)
			go func() { done <- f.waitToRewatch(context.Background(), time.Hour) }()
			if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, wait.ForeverTestTimeout, true,
				func(context.Context) (bool, error) { return clk.HasWaiters(), nil }); err != nil {
				t.Fatal(err)
			}
			if tc.during {
				_ = f.answer(nil)
				_ = f.answer(errors.New("failed requests prove nothing"))
			}
			// Step until the minimum delay has passed, and a little more.
			deadline := time.After(wait.ForeverTestTimeout)
			early := false
			for stepped := time.Duration(0); stepped < 2*minRewatchDelay; stepped += time.Millisecond {
				clk.Step(time.Millisecond)
				select {
				case <-done:
					early = true
				case <-time.After(time.Millisecond):
				case <-deadline:
					t.Fatal("timed out")
				}
				if early {
					break
				}
			}
			if early != tc.wantEarly {
				t.Fatalf("returned within %v: %v, want %v", 2*minRewatchDelay, early, tc.wantEarly)
			}
		})
	}
}

// TestClassifyEtcd checks what each error that ends an etcd watch means:
// a re-watch from the head, or only for a compaction, a re-list.
func TestClassifyEtcd(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		reason string
		relist bool
	}{
		{"no leader", rpctypes.ErrNoLeader, EndNoLeader, false},
		{"leader changed", rpctypes.ErrLeaderChanged, EndUnavailable, false},
		{"grpc unavailable", errors.New("rpc error: code = Unavailable desc = transport is closing"), EndUnavailable, false},
		{"timeout", context.DeadlineExceeded, EndUnavailable, false},
		{"compacted", rpctypes.ErrCompacted, EndCompacted, true},
		{"future revision", rpctypes.ErrFutureRev, EndUnavailable, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := classifyEtcd(tc.err)
			if got.Reason != tc.reason || got.Relist != tc.relist {
				t.Errorf("classifyEtcd(%v) = %s relist=%v, want %s relist=%v", tc.err, got.Reason, got.Relist, tc.reason, tc.relist)
			}
		})
	}
}

// TestRewatchDelay checks that after a member said it has no leader the
// follower tries again within noLeaderRewatchDelay however long the
// outage, where other ends back off to maxRewatchDelay.
func TestRewatchDelay(t *testing.T) {
	tests := []struct {
		reason  string
		longest time.Duration
	}{
		{reason: EndNoLeader, longest: noLeaderRewatchDelay},
		{reason: EndUnavailable, longest: maxRewatchDelay},
		{reason: EndSilent, longest: maxRewatchDelay},
	}
	for _, tc := range tests {
		t.Run(tc.reason, func(t *testing.T) {
			backoff := rewatchBackoff()
			var longest time.Duration
			for range 20 {
				longest = max(longest, rewatchDelay(End{Reason: tc.reason}, backoff))
			}
			// The backoff's jitter adds up to 10% to each step, its cap
			// included.
			if longest < tc.longest || longest > tc.longest*11/10 {
				t.Errorf("the longest of 20 waits after %s: %v, want %v", tc.reason, longest, tc.longest)
			}
		})
	}
}

// TestNewWatchAsksUntilHeard checks that a watch that replaces one lost
// in an outage asks for progress every syncPollEvery until it hears
// something, at most syncPolls times: etcd drops the requests made before
// it has synced the watch, and an idle resource hears nothing else. The
// first watch, after the list, does not poll.
func TestNewWatchAsksUntilHeard(t *testing.T) {
	for _, hears := range []bool{false, true} {
		t.Run(fmt.Sprintf("hears=%v", hears), func(t *testing.T) {
			etcd := newFakeEtcd(3, pod("a", 2))
			h := newHarness(etcd, nil)
			h.run(t)
			first := etcd.next(t)
			h.waitState(t, Ready)
			countOn := func(stream int) int {
				n := 0
				for _, s := range etcd.progressRequests() {
					if s == stream {
						n++
					}
				}
				return n
			}
			testkit.Eventually(t, "the request as the first watch opens", func() bool { return countOn(first.stream) == 1 })
			for range 3 {
				h.clk.Step(syncPollEvery)
			}
			if n := countOn(first.stream); n != 1 {
				t.Fatalf("the first watch asked %d times; want once, as it opened", n)
			}
			first.w.stop()
			w := h.nextWatch(t)
			asked := func() int {
				n := 0
				for _, s := range etcd.progressRequests() {
					if s == w.stream {
						n++
					}
				}
				return n
			}
			// step moves the clock by a poll, a few times, until the watch
			// asks again, and reports whether it did: a step taken before
			// the watch re-arms its timer fires nothing.
			step := func() bool {
				n := asked()
				for range 10 {
					h.clk.Step(syncPollEvery)
					if wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 20*time.Millisecond, true,
						func(context.Context) (bool, error) { return asked() > n, nil }) == nil {
						return true
					}
				}
				return false
			}
			testkit.Eventually(t, "the request as the watch opens", func() bool { return asked() == 1 })
			if !step() {
				t.Fatal("the watch did not ask again after a poll's time without an answer")
			}
			if hears {
				w.w.send(Response{Progress: 3})
				testkit.Eventually(t, "the progress notification applied", func() bool { _, head := h.cache.Bounds(); return head == 3 })
				for range 3 {
					if step() {
						t.Fatalf("the watch asked again after it heard etcd: %d requests", asked())
					}
				}
				return
			}
			for asked() < syncPolls {
				if !step() {
					t.Fatalf("the watch stopped asking after %d requests, want %d", asked(), syncPolls)
				}
			}
			if step() {
				t.Fatalf("the watch asked %d times, want at most %d", asked(), syncPolls)
			}
		})
	}
}
