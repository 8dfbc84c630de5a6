package testkit

import (
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
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
//
// A target that refuses a connection, as a killed member does, makes the
// proxy refuse new ones too, by closing its listener (and holding its
// port), until the target accepts again: a client sees what it would see
// without the proxy.
type Proxy struct {
	// addr is where the proxy listens, the same across refusals.
	addr string
	// toClients counts the bytes forwarded from the target to clients.
	toClients atomic.Int64

	// mu guards everything below.
	mu sync.Mutex
	// ln is nil while the proxy refuses connections.
	ln     net.Listener
	target string
	conns  map[*proxyConn]struct{}
	// flowing is closed while bytes may flow; a blackhole replaces it with
	// an open channel that heal closes.
	flowing chan struct{}
	delay   time.Duration
	jitter  time.Duration
	// dropped is set by Drop, until Heal.
	dropped bool
	// targetDown is set when the target refused a connection, until it
	// accepts one again.
	targetDown bool
	// watching is set while a goroutine (watch) brings the listener back.
	watching bool
	// hold is a socket bound to addr, not listening, while ln is nil
	// (holdPort); -1 when none.
	hold   int
	closed bool
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
	p := &Proxy{target: target, conns: map[*proxyConn]struct{}{}, flowing: flowing, hold: -1}
	p.mu.Lock() // connect waits for ln
	defer p.mu.Unlock()
	var err error
	if p.ln, err = serveOn("127.0.0.1:0", p.connect); err != nil {
		return nil, err
	}
	p.addr = p.ln.Addr().String()
	return p, nil
}

// URL is the proxy's address as an etcd client URL.
func (p *Proxy) URL() string { return "http://" + p.addr }

func (p *Proxy) connect(in net.Conn) {
	p.mu.Lock()
	target, refuse := p.target, p.ln == nil
	p.mu.Unlock()
	if refuse { // accepted just before the listener closed
		(&proxyConn{client: in, server: in}).close(true)
		return
	}
	out, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		(&proxyConn{client: in, server: in}).close(true)
		if errors.Is(err, syscall.ECONNREFUSED) {
			p.mu.Lock()
			p.targetDown = true
			p.syncListener()
			p.mu.Unlock()
		}
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
	p.dropped = true
	p.syncListener()
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
	p.delay, p.jitter, p.dropped = 0, 0, false
	p.syncListener()
}

// Close stops the proxy and its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Heal()
	p.Reset()
}

// syncListener listens on addr unless the proxy is dropped, closed or its
// target down, and otherwise holds the port without listening; what it
// cannot do at once (see the target up again, listen on a port still
// held) a goroutine retries. mu held.
func (p *Proxy) syncListener() {
	want := !p.closed && !p.dropped && !p.targetDown
	if !want && p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
		if !p.closed {
			p.hold, _ = holdPort(p.addr)
		}
	}
	if (want || p.closed) && p.hold >= 0 {
		_ = syscall.Close(p.hold)
		p.hold = -1
	}
	if want && p.ln == nil {
		if ln, err := serveOn(p.addr, p.connect); err == nil {
			p.ln = ln
		}
	}
	if !p.closed && !p.watching && (p.targetDown || (want && p.ln == nil)) {
		p.watching = true
		go p.watch()
	}
}

// holdPort binds a TCP socket to addr without listening: a connection to
// it is refused, as to a port nothing listens on, and no other socket
// (another test's listener, an outgoing connection's local port) can take
// the port until the proxy listens on it again.
func holdPort(addr string) (int, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return -1, err
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		_ = syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// watch dials a target that went down, and retries listening, every
// 20 ms until the proxy listens again, is dropped or closed.
func (p *Proxy) watch() {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		p.mu.Lock()
		down, target, closed := p.targetDown, p.target, p.closed
		if closed {
			p.watching = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if down {
			c, err := net.DialTimeout("tcp", target, time.Second)
			if err != nil {
				continue
			}
			_ = c.Close()
		}
		p.mu.Lock()
		if down && p.target == target {
			p.targetDown = false
		}
		p.watching = false // syncListener starts another if one is needed
		p.syncListener()
		p.mu.Unlock()
		return
	}
}

// Retarget forwards new connections to target, and resets the open ones.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
	p.Reset()
}
