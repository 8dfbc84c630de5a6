package cacher

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// recvWithin receives from ch, failing the test if nothing comes within
// wait.ForeverTestTimeout: a regression that stops a channel fails in
// seconds, not at the package's timeout. ok is false if ch was closed.
func recvWithin[T any](t testing.TB, ch <-chan T, what string) (v T, ok bool) {
	t.Helper()
	select {
	case v, ok = <-ch:
		return v, ok
	case <-time.After(wait.ForeverTestTimeout):
		t.Fatalf("%s: nothing within %v", what, wait.ForeverTestTimeout)
		return v, false
	}
}
