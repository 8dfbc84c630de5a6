//go:build faultinject

package inject

import (
	"os"
	"sync/atomic"
)

// current is the fault injected: the environment's, or what Set set.
var current atomic.Pointer[Fault]

func init() {
	f := Fault(os.Getenv(Env))
	current.Store(&f)
}

// On reports whether fault f is injected.
func On(f Fault) bool { return *current.Load() == f }

// Set injects f, for a test in this build, and returns what undoes it.
func Set(f Fault) (restore func()) {
	old := current.Swap(&f)
	return func() { current.Store(old) }
}

// Current is the fault injected, "" if none.
func Current() Fault { return *current.Load() }
