package testkit

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	compbasemetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
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
