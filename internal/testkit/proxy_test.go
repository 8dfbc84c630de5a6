package testkit

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// serve runs handle for every connection to a new loopback listener, and
// returns its address.
func serve(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// echoServer echoes every connection on loopback.
func echoServer(t *testing.T) string {
	return serve(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// roundTrip writes msg and reads it back, or fails after timeout.
func roundTrip(c net.Conn, msg string, timeout time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

// TestProxyRefusesAsItsTargetDoes checks that a proxy whose target refuses
// connections, as a killed etcd member does, refuses them too, and accepts
// them again once its target does: a client behind it sees the refusal it
// would see without it.
func TestProxyRefusesAsItsTargetDoes(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := target.Addr().String()
	target.Close()
	p, err := NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The first connection finds the target down: it is reset, as it was
	// accepted before the proxy knew. The next ones are refused.
	refused := func(context.Context) (bool, error) {
		c, err := net.Dial("tcp", p.addr)
		if err == nil {
			_, err = roundTrip(c, "x", time.Second)
			c.Close()
		}
		return errors.Is(err, syscall.ECONNREFUSED), nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, refused); err != nil {
		t.Fatal("the proxy of a refusing target never refused a dial")
	}
	// While it refuses, the port stays the proxy's.
	if ln, err := net.Listen("tcp", p.addr); err == nil {
		ln.Close()
		t.Fatal("another listener took the port of a proxy that refuses")
	}
	target, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	defer target.Close()
	back := func(context.Context) (bool, error) {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			return false, nil
		}
		defer c.Close()
		got, err := roundTrip(c, "back", time.Second)
		return err == nil && got == "back", nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, back); err != nil {
		t.Fatal("the proxy did not forward again within 5 s of its target's return")
	}
}

func TestProxy(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := dial()
	if got, err := roundTrip(c, "plain", time.Second); err != nil || got != "plain" {
		t.Fatalf("through a healthy proxy: %q, %v", got, err)
	}
	// The echo came back: five bytes from the target to the client.
	if got := p.ToClients(); got != int64(len("plain")) {
		t.Fatalf("ToClients() = %d after one echo of 5 bytes, want 5", got)
	}

	t.Run("blackhole holds bytes until heal", func(t *testing.T) {
		p.Blackhole()
		if _, err := roundTrip(c, "held", 200*time.Millisecond); err == nil {
			t.Fatal("bytes went through a blackhole")
		}
		p.Heal()
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
			t.Fatalf("after heal: %q, %v; want the held bytes", buf, err)
		}
	})
	t.Run("delay", func(t *testing.T) {
		p.SetDelay(100*time.Millisecond, 0)
		defer p.Heal()
		start := time.Now()
		if got, err := roundTrip(c, "slow", 2*time.Second); err != nil || got != "slow" {
			t.Fatalf("delayed round trip: %q, %v", got, err)
		}
		// Both directions are delayed.
		if took := time.Since(start); took < 200*time.Millisecond {
			t.Errorf("round trip took %v through a 100ms delay each way", took)
		}
	})
	t.Run("reset", func(t *testing.T) {
		c := dial()
		if _, err := roundTrip(c, "x", time.Second); err != nil {
			t.Fatal(err)
		}
		p.Reset()
		if _, err := roundTrip(c, "y", time.Second); err == nil {
			t.Fatal("a reset connection still works")
		}
		if got, err := roundTrip(dial(), "new", time.Second); err != nil || got != "new" {
			t.Fatalf("a new connection after reset: %q, %v", got, err)
		}
	})
	t.Run("drop refuses until heal", func(t *testing.T) {
		p.Drop()
		if c, err := net.Dial("tcp", p.addr); !errors.Is(err, syscall.ECONNREFUSED) {
			if c != nil {
				c.Close()
			}
			t.Fatalf("a dial during a drop: %v, want it refused", err)
		}
		p.Heal()
		if got, err := roundTrip(dial(), "back", time.Second); err != nil || got != "back" {
			t.Fatalf("after heal: %q, %v", got, err)
		}
	})
	t.Run("retarget moves new connections", func(t *testing.T) {
		c := dial()
		if _, err := roundTrip(c, "x", time.Second); err != nil {
			t.Fatal(err) // the proxy now holds c
		}
		p.Retarget(echoServer(t))
		if _, err := roundTrip(c, "x", time.Second); err == nil {
			t.Fatal("a connection to the old target still works")
		}
		if got, err := roundTrip(dial(), "moved", time.Second); err != nil || got != "moved" {
			t.Fatalf("a new connection after retarget: %q, %v", got, err)
		}
	})
}
