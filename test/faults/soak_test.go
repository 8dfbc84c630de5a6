package faults

import "testing"

// TestSoakLeaks checks the leak check's arithmetic: growth past 10% in any
// of the three is a leak, anything within it is not.
func TestSoakLeaks(t *testing.T) {
	base := processSample{goroutines: 200, fds: 50, heap: 100 << 20}
	tests := []struct {
		name  string
		after processSample
		leaks int
	}{
		{"unchanged", base, 0},
		{"within 10%", processSample{goroutines: 219, fds: 55, heap: 109 << 20}, 0},
		{"fewer", processSample{goroutines: 100, fds: 10, heap: 10 << 20}, 0},
		{"goroutines grew", processSample{goroutines: 221, fds: 50, heap: 100 << 20}, 1},
		{"everything grew", processSample{goroutines: 400, fds: 60, heap: 200 << 20}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &soakResult{before: base, after: tc.after}
			if got := r.leaks(); len(got) != tc.leaks {
				t.Errorf("leaks() = %q, want %d", got, tc.leaks)
			}
		})
	}
}
