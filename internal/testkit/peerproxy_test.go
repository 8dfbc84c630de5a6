package testkit

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// TestPeerProxy checks that a cut holds exactly the cut sender's
// connections, old and new, both ways, and that healing closes them and
// lets the sender connect again.
func TestPeerProxy(t *testing.T) {
	p, err := NewPeerProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// open connects as a member advertising peerURL ("" for a request
	// without the header) and reads the echo of its request's head.
	open := func(peerURL string) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		head := "GET /raft/stream/message/1 HTTP/1.1\r\nHost: x\r\n"
		if peerURL != "" {
			head += "X-PeerURLs: " + peerURL + "\r\n"
		}
		head += "\r\n"
		if got, err := roundTrip(c, head, 5*time.Second); err != nil || got != head {
			t.Fatalf("the head from %q did not come back: %q, %v", peerURL, got, err)
		}
		return c
	}
	a, b := open("http://127.0.0.1:1"), open("http://127.0.0.1:2")

	p.Cut("http://127.0.0.1:1")
	if _, err := roundTrip(a, "held", 200*time.Millisecond); err == nil {
		t.Fatal("bytes of a cut sender went through")
	}
	if got, err := roundTrip(b, "other", 5*time.Second); err != nil || got != "other" {
		t.Fatalf("a sender not cut: %q, %v", got, err)
	}
	if got, err := roundTrip(open(""), "probe", 5*time.Second); err != nil || got != "probe" {
		t.Fatalf("a request without X-PeerURLs: %q, %v", got, err)
	}
	// A new connection of the cut sender is held before its head goes on.
	late, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if _, err := roundTrip(late, "GET / HTTP/1.1\r\nX-PeerURLs: http://127.0.0.1:1\r\n\r\n", 200*time.Millisecond); err == nil {
		t.Fatal("a new connection of a cut sender went through")
	}

	p.Heal()
	for name, c := range map[string]net.Conn{"held": a, "new while cut": late} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 16)); !errors.Is(err, io.EOF) {
			t.Errorf("the %s connection after heal: %v, want it closed (EOF) with nothing delivered", name, err)
		}
	}
	if got, err := roundTrip(open("http://127.0.0.1:1"), "again", 5*time.Second); err != nil || got != "again" {
		t.Fatalf("the healed sender connecting again: %q, %v", got, err)
	}
}
