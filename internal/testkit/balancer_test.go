package testkit

import (
	"net"
	"testing"
	"time"
)

// namedEcho answers every byte with its name.
func namedEcho(t *testing.T, name string) string {
	return serve(t, func(c net.Conn) {
		buf := make([]byte, 1)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if _, err := c.Write([]byte(name)); err != nil {
				return
			}
		}
	})
}

func TestBalancer(t *testing.T) {
	a, b := namedEcho(t, "a"), namedEcho(t, "b")
	lb, err := NewBalancer([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	// ask opens a connection and returns the backend that answers.
	ask := func(t *testing.T) (string, net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", lb.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		got, err := roundTrip(c, "?", time.Second)
		if err != nil {
			t.Fatalf("through the balancer: %v", err)
		}
		return got, c
	}

	first, _ := ask(t)
	second, conn := ask(t)
	if first == second {
		t.Fatalf("two connections both went to %s; want round-robin", first)
	}
	t.Run("busiest", func(t *testing.T) {
		third, _ := ask(t) // one backend now has two
		if got, want := lb.Busiest(), map[string]int{"a": 0, "b": 1}[third]; got != want {
			t.Fatalf("Busiest() = %d, want %d, which has two connections", got, want)
		}
	})
	t.Run("drop keeps open connections", func(t *testing.T) {
		i := map[string]int{"a": 0, "b": 1}[second]
		lb.Drop(i)
		if got, err := roundTrip(conn, "?", time.Second); err != nil || got != second {
			t.Fatalf("an open connection to a dropped backend: %q, %v", got, err)
		}
		for range 4 {
			if got, _ := ask(t); got == second {
				t.Fatalf("a new connection went to dropped backend %s", second)
			}
		}
		lb.Replace(i, map[string]string{"a": a, "b": b}[second]) // back in
	})
	t.Run("lose resets open connections", func(t *testing.T) {
		got, c := ask(t)
		lb.Lose(map[string]int{"a": 0, "b": 1}[got])
		if _, err := roundTrip(c, "?", time.Second); err == nil {
			t.Fatalf("a connection to lost backend %s still works", got)
		}
		for range 4 {
			if again, _ := ask(t); again == got {
				t.Fatalf("a new connection went to lost backend %s", got)
			}
		}
	})
}
