package testkit

import (
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 between the API server and one etcd
// member, with the network faults the harness injects:
//
//   - blackhole: bytes stop flowing both ways, and flow again on heal, as
//     through a partition TCP survives. Connections stay open, so only a
//     keepalive or the server's own silence check notices.
//   - delay: every chunk is held for a latency with jitter, in order.
//   - reset: every open connection is reset (RST) at once.
//   - drop: new connections are refused and open ones reset until heal.
type Proxy struct {
	ln net.Listener
	// toClients counts the bytes forwarded from the target to clients.
	toClients atomic.Int64

	// mu guards everything below.
	mu     sync.Mutex
	target string
	conns  map[*proxyConn]struct{}
	// flowing is closed while bytes may flow; a blackhole replaces it with
	// an open channel that heal closes.
	flowing chan struct{}
	delay   time.Duration
	jitter  time.Duration
	refuse  bool
	closed  bool
}

// proxyConn is one proxied connection: the client's side and etcd's.
type proxyConn struct {
	client, server net.Conn
	once           sync.Once
}

func (c *proxyConn) close(reset bool) {
	c.once.Do(func() {
		for _, conn := range []net.Conn{c.client, c.server} {
			if tcp, ok := conn.(*net.TCPConn); ok && reset {
				_ = tcp.SetLinger(0) // Close then sends RST.
			}
			_ = conn.Close()
		}
	})
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	flowing := make(chan struct{})
	close(flowing)
	p := &Proxy{target: target, conns: map[*proxyConn]struct{}{}, flowing: flowing}
	var err error
	if p.ln, err = serveLoopback(p.connect); err != nil {
		return nil, err
	}
	return p, nil
}

// URL is the proxy's address as an etcd client URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *Proxy) connect(in net.Conn) {
	p.mu.Lock()
	target, refuse := p.target, p.refuse
	p.mu.Unlock()
	if refuse {
		(&proxyConn{client: in, server: in}).close(true)
		return
	}
	out, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		(&proxyConn{client: in, server: in}).close(true)
		return
	}
	c := &proxyConn{client: in, server: out}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close(false)
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	go p.pipe(c, c.server, c.client)
	p.pipe(c, c.client, c.server)
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// chunk is bytes read from one side, due at the other at a time.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst through the faults until either side closes. A
// reader goroutine keeps reading, so that a closed side is noticed even
// while a blackhole holds the bytes.
func (p *Proxy) pipe(c *proxyConn, dst, src net.Conn) {
	defer c.close(false)
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		var last time.Time
		for {
			buf := make([]byte, 32*1024)
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now().Add(p.latency())
				if due.Before(last) {
					due = last // jitter never reorders bytes
				}
				last = due
				chunks <- chunk{data: buf[:n], due: due}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					c.close(false)
				}
				return
			}
		}
	}()
	for ch := range chunks {
		for {
			p.mu.Lock()
			flowing := p.flowing
			p.mu.Unlock()
			<-flowing
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d) // the injected latency itself
			}
			// A blackhole may have started during the delay.
			p.mu.Lock()
			still := p.flowing == flowing
			p.mu.Unlock()
			if still {
				break
			}
		}
		if dst == c.client {
			p.toClients.Add(int64(len(ch.data)))
		}
		if _, err := dst.Write(ch.data); err != nil {
			return
		}
	}
}

// ToClients returns how many bytes the proxy has forwarded from its target
// to its clients: which member serves a client's busiest watch shows here.
func (p *Proxy) ToClients() int64 { return p.toClients.Load() }

func (p *Proxy) latency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delay == 0 {
		return 0
	}
	d := p.delay
	if p.jitter > 0 {
		d += time.Duration(rand.Int64N(int64(2*p.jitter))) - p.jitter
	}
	return max(d, 0)
}

// Blackhole stops bytes both ways until heal.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
		p.flowing = make(chan struct{})
	default: // already blackholed
	}
}

// SetDelay holds every chunk for delay ± jitter until heal.
func (p *Proxy) SetDelay(delay, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.jitter = delay, jitter
}

// Reset resets every open connection.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := slices.Collect(maps.Keys(p.conns))
	p.mu.Unlock()
	for _, c := range conns {
		c.close(true)
	}
}

// Drop refuses new connections until heal and resets open ones.
func (p *Proxy) Drop() {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
	p.Reset()
}

// Heal ends every fault.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
	default:
		close(p.flowing)
	}
	p.delay, p.jitter, p.refuse = 0, 0, false
}

// Close stops the proxy and its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Heal()
	_ = p.ln.Close()
	p.Reset()
}

// Retarget forwards new connections to target, and resets the open ones.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
	p.Reset()
}
