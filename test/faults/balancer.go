package faults

import (
	"net"
	"sync"
	"time"
)

// balancer spreads TCP connections over API server replicas round-robin,
// as a Service's virtual IP does, skipping a replica that refuses the
// connection. Each connection sticks to its replica until it closes, so an
// HTTP/2 client moves to another replica only when its replica goes.
type balancer struct {
	ln net.Listener

	// mu guards backends and next.
	mu       sync.Mutex
	backends []string
	next     int
}

func newBalancer(backends []string) (*balancer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &balancer{ln: ln, backends: backends}
	go b.serve()
	return b, nil
}

// addr is where clients connect.
func (b *balancer) addr() string { return b.ln.Addr().String() }

func (b *balancer) serve() {
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		go b.forward(in)
	}
}

// forward connects in to the next replica that accepts.
func (b *balancer) forward(in net.Conn) {
	b.mu.Lock()
	n := len(b.backends)
	b.mu.Unlock()
	for tries := 0; tries < n; tries++ {
		b.mu.Lock()
		target := b.backends[b.next%n]
		b.next++
		b.mu.Unlock()
		out, err := net.DialTimeout("tcp", target, time.Second)
		if err != nil {
			continue
		}
		c := &proxyConn{client: in, server: out}
		go func() { copyAndClose(c, out, in) }()
		copyAndClose(c, in, out)
		return
	}
	_ = in.Close()
}

func copyAndClose(c *proxyConn, dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	c.close(false)
}

func (b *balancer) close() { _ = b.ln.Close() }

// drop stops sending new connections to backend i; open ones stay.
func (b *balancer) drop(i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends = append(b.backends[:i:i], b.backends[i+1:]...)
}

// replace sends the connections backend i would get to addr instead; open
// ones stay.
func (b *balancer) replace(i int, addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends[i] = addr
}
