package testkit

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	testingclock "k8s.io/utils/clock/testing"
)

// Recv receives from ch, failing the test if nothing comes within
// wait.ForeverTestTimeout: a regression that stops a channel fails in
// seconds, not at the package's timeout. ok is false if ch was closed.
func Recv[T any](tb testing.TB, ch <-chan T, what string) (v T, ok bool) {
	tb.Helper()
	select {
	case v, ok = <-ch:
		return v, ok
	case <-time.After(wait.ForeverTestTimeout):
		tb.Fatalf("%s: nothing within %v", what, wait.ForeverTestTimeout)
		return v, false
	}
}

// WaitGauge waits until g reads n, failing the test if it does not within
// wait.ForeverTestTimeout. what names the gauge in the failure.
func WaitGauge(tb testing.TB, g compbasemetrics.GaugeMetric, n float64, what string) {
	tb.Helper()
	var v float64
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) {
			var err error
			v, err = testutil.GetGaugeMetricValue(g)
			return v == n, err
		}); err != nil {
		tb.Fatalf("%v %s, want %v", v, what, n)
	}
}

// StepUntil steps clk by 100 ms until cond holds, failing the test if it
// does not within wait.ForeverTestTimeout of real time: for code that waits
// on a fake clock for something another goroutine does.
func StepUntil(tb testing.TB, clk *testingclock.FakeClock, cond func() bool) {
	tb.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) {
			if cond() {
				return true, nil
			}
			clk.Step(100 * time.Millisecond)
			return false, nil
		})
	if err != nil {
		tb.Fatalf("condition never held: %v", err)
	}
}

// Eventually waits until cond holds, polling, failing the test if it does
// not within wait.ForeverTestTimeout: for what another goroutine does and
// nothing signals. what names the wait in the failure.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		tb.Fatalf("%s: not within %v", what, wait.ForeverTestTimeout)
	}
}
