package faults

import (
	"fmt"
	"slices"
	"testing"
)

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

// TestGrownStacks checks that the leak report names the stacks that grew,
// from pprof's debug=1 text, most first, and only those.
func TestGrownStacks(t *testing.T) {
	profile := func(conns, watches int) string {
		return fmt.Sprintf(`goroutine profile: total %d
%d @ 0x4 0x5
#	0x4	golang.org/x/net/http2.(*serverConn).serve+0x7c	/x/server.go:1
#	0x5	net/http.(*conn).serve+0x10	/x/server.go:2

%d @ 0x6
#	0x6	example.com/cacher.(*watcher).run+0x1	/x/watcher.go:3

1 @ 0x7
#	0x7	main.main+0x1	/x/main.go:4
`, conns+watches+1, conns, watches)
	}
	tests := []struct {
		name          string
		before, after string
		want          []string
	}{
		{"nothing grew", profile(3, 5), profile(3, 4), nil},
		{"connections grew", profile(3, 5), profile(13, 5),
			[]string{"+10 golang.org/x/net/http2.(*serverConn).serve < net/http.(*conn).serve"}},
		{"most grown first", profile(3, 5), profile(4, 8), []string{
			"+3 example.com/cacher.(*watcher).run",
			"+1 golang.org/x/net/http2.(*serverConn).serve < net/http.(*conn).serve",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := grown(parseGoroutines(tc.before), parseGoroutines(tc.after), 8)
			if !slices.Equal(got, tc.want) {
				t.Errorf("grown() = %q, want %q", got, tc.want)
			}
		})
	}
}
