package embedetcd

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePort checks that FreePort's ports lie below the ephemeral range,
// where no outgoing connection or listener on port 0 can take them, are
// never handed out twice, and can be bound.
func TestFreePort(t *testing.T) {
	top := ephemeralLow()
	if top-lowestPort < 1000 {
		t.Fatalf("this machine's ephemeral range starts at %d, leaving no room below it; the test needs Linux's default layout", top)
	}
	seen := map[int]bool{}
	for range 500 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < lowestPort || port >= top {
			t.Fatalf("FreePort() = %d, want a port in [%d, %d)", port, lowestPort, top)
		}
		if seen[port] {
			t.Fatalf("FreePort() returned %d twice", port)
		}
		seen[port] = true
	}
	for port := range seen {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("binding a port FreePort returned: %v", err)
		}
		l.Close()
		break
	}
}
