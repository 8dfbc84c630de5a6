package source

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"
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
