package etcdconn

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/server/egressselector"
	testingclock "k8s.io/utils/clock/testing"
)

// TestDropQuiet checks that DropQuiet closes exactly the connections that
// received nothing for the quiet duration, counting a connection that never
// received anything from its dial, and that the others keep working.
func TestDropQuiet(t *testing.T) {
	tests := []struct {
		name string
		// received is, per connection, how long before DropQuiet it last
		// received bytes; negative means never (it was dialled 10 s before).
		received []time.Duration
		quiet    time.Duration
		dropped  []bool
	}{{
		name:     "only the quiet one",
		received: []time.Duration{time.Second, 9 * time.Second},
		quiet:    8 * time.Second,
		dropped:  []bool{false, true},
	}, {
		name:     "exactly quiet counts",
		received: []time.Duration{8 * time.Second},
		quiet:    8 * time.Second,
		dropped:  []bool{true},
	}, {
		name:     "never received, dialled long ago",
		received: []time.Duration{-1, 0},
		quiet:    8 * time.Second,
		dropped:  []bool{true, false},
	}, {
		name:     "none quiet enough",
		received: []time.Duration{7 * time.Second, 0},
		quiet:    8 * time.Second,
		dropped:  []bool{false, false},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := testingclock.NewFakeClock(time.Unix(1000, 0))
			tr := New(Config{Clock: clk})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			dialled := clk.Now()
			var clients, servers []net.Conn
			for range tc.received {
				c, err := tr.Dial(context.Background(), "tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				s, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				defer s.Close()
				clients, servers = append(clients, c), append(servers, s)
			}
			// Each connection receives a byte at its time, oldest first.
			end := dialled.Add(10 * time.Second)
			for i, ago := range tc.received {
				if ago < 0 {
					continue
				}
				clk.SetTime(end.Add(-ago))
				roundTrip(t, servers[i], clients[i])
			}
			clk.SetTime(end)

			want := 0
			for _, d := range tc.dropped {
				if d {
					want++
				}
			}
			if got := tr.DropQuiet(tc.quiet); got != want {
				t.Errorf("DropQuiet closed %d connections, want %d", got, want)
			}
			if got := tr.Open(); got != len(tc.received)-want {
				t.Errorf("%d connections tracked after DropQuiet, want %d", got, len(tc.received)-want)
			}
			for i, d := range tc.dropped {
				closed := closedByPeer(t, servers[i])
				if closed != d {
					t.Errorf("connection %d: closed %v, want %v", i, closed, d)
				}
				if !d {
					roundTrip(t, servers[i], clients[i])
				}
			}
		})
	}
}

// TestLookupDialsThroughTheTracker checks the egress lookup's dialer is the
// tracker's, so that the storage factory's connections are tracked.
func TestLookupDialsThroughTheTracker(t *testing.T) {
	tr := New(Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dial, err := tr.Lookup(egressselector.Etcd.AsNetworkContext())
	if err != nil {
		t.Fatal(err)
	}
	c, err := dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.Open(); got != 1 {
		t.Fatalf("%d connections tracked, want 1", got)
	}
	_ = c.Close()
	if got := tr.Open(); got != 0 {
		t.Fatalf("%d connections tracked after Close, want 0", got)
	}
}

// roundTrip sends a byte from server to client through the tracked side.
func roundTrip(t *testing.T, server, client net.Conn) {
	t.Helper()
	if _, err := server.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(client, make([]byte, 1)); err != nil {
		t.Fatalf("the client did not receive: %v", err)
	}
}

// closedByPeer reports whether the other side closed server's connection.
func closedByPeer(t *testing.T, server net.Conn) bool {
	t.Helper()
	_ = server.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := server.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		_ = server.SetReadDeadline(time.Time{})
		return false
	default:
		t.Fatalf("reading the server side: %v", err)
		return false
	}
}
