//go:build !faultinject

package inject

import "context"

// Enabled is whether this build has failpoints: guard a failpoint's
// handling with it, so that none of it is compiled in.
const Enabled = false

// On reports whether fault f is injected: never, in this build.
func On(Fault) bool { return false }

// Hit is failpoint p: in this build it does nothing, and the compiler
// drops it and its point's name.
func Hit(context.Context, Point) error { return nil }
