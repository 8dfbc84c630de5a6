package integration

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// balancer spreads connections over a Service's endpoints round-robin, as
// kube-proxy does, and can lose one: cut resets its open connections and
// sends no new ones to it, as when its pod dies.
type balancer struct {
	ln net.Listener

	// mu guards everything below.
	mu       sync.Mutex
	backends []string
	cut      map[int]bool
	next     int
	conns    map[int][]net.Conn
	open     map[int]int
	// stops stop each endpoint's server gracefully, as SIGTERM does.
	stops []func()
}

func newBalancer(t *testing.T, backends []string) *balancer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{ln: ln, backends: backends, cut: map[int]bool{}, conns: map[int][]net.Conn{}, open: map[int]int{}}
	t.Cleanup(func() { ln.Close() })
	go b.serve()
	return b
}

func (b *balancer) serve() {
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		go b.forward(in)
	}
}

// forward connects in to the next endpoint that accepts, as kube-proxy
// only sends to ready endpoints.
func (b *balancer) forward(in net.Conn) {
	var out net.Conn
	i := -1
	for tries := 0; tries < len(b.backends) && out == nil; tries++ {
		b.mu.Lock()
		candidate := b.next % len(b.backends)
		b.next++
		cut := b.cut[candidate]
		b.mu.Unlock()
		if cut {
			continue
		}
		if c, err := net.DialTimeout("tcp", b.backends[candidate], 5*time.Second); err == nil {
			out, i = c, candidate
		}
	}
	if out == nil {
		in.Close()
		return
	}
	b.mu.Lock()
	b.conns[i] = append(b.conns[i], in, out)
	b.open[i]++
	b.mu.Unlock()
	go func() { _, _ = io.Copy(out, in); out.Close(); in.Close() }()
	_, _ = io.Copy(in, out)
	in.Close()
	out.Close()
	b.mu.Lock()
	b.open[i]--
	b.mu.Unlock()
}

// busiest returns the endpoint with the most open connections: the one the
// aggregator's long-lived proxy connection goes to.
func (b *balancer) busiest() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	best := 0
	for i := range b.backends {
		if b.open[i] > b.open[best] {
			best = i
		}
	}
	return best
}

// lose resets every connection to endpoint i and sends no more to it.
func (b *balancer) lose(i int) {
	b.mu.Lock()
	b.cut[i] = true
	conns := b.conns[i]
	b.conns[i] = nil
	b.mu.Unlock()
	for _, c := range conns {
		if tcp, ok := c.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0)
		}
		c.Close()
	}
}
