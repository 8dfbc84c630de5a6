package testkit

import (
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/embedetcd"
)

// FreePort returns a loopback port that was free a moment ago, for a
// process that must be told its port.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := embedetcd.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}
