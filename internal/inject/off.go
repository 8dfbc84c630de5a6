//go:build !faultinject

package inject

// On reports whether fault f is injected: never, in this build.
func On(Fault) bool { return false }
