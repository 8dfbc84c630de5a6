package testkit

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"time"
)

// PeerProxy stands in front of one etcd member's peer port, so that a
// test can partition members. Each member advertises its proxy's URL to
// its peers, and etcd's peers connect only to each other's advertised URLs,
// so every connection between two members passes one of the two proxies
// (which depends on who dialled: raft messages to a member travel on
// streams the member itself opened to the sender). A proxy tells who opened
// a connection from the first request's X-PeerURLs header, which etcd's
// rafthttp sets to the sender's advertised peer URLs on every stream and
// post. Cutting a sender holds its connections' bytes both ways, as a
// partition that TCP survives does; healing closes them, so that the
// members dial again and no held message arrives late. Requests without the
// header (etcd's probes and version checks) are never cut.
type PeerProxy struct {
	ln     net.Listener
	target string

	// mu guards everything below.
	mu    sync.Mutex
	conns map[*peerConn]struct{}
	// cut holds the senders, by advertised peer URL, whose connections
	// are held.
	cut map[string]bool
	// healed is closed by Heal; Cut replaces it with an open channel.
	healed chan struct{}
	closed bool
}

// peerConn is one proxied connection and who opened it.
type peerConn struct {
	from           string
	client, server net.Conn
	once           sync.Once
}

func (c *peerConn) close() {
	c.once.Do(func() {
		_ = c.client.Close()
		if c.server != nil {
			_ = c.server.Close()
		}
	})
}

// NewPeerProxy listens on a free loopback port and forwards to target.
func NewPeerProxy(target string) (*PeerProxy, error) {
	healed := make(chan struct{})
	close(healed)
	p := &PeerProxy{target: target, conns: map[*peerConn]struct{}{}, cut: map[string]bool{}, healed: healed}
	var err error
	if p.ln, err = serveLoopback(p.connect); err != nil {
		return nil, err
	}
	return p, nil
}

// Port is the proxy's port on 127.0.0.1.
func (p *PeerProxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// connect reads who opened in from its first request, then forwards it.
func (p *PeerProxy) connect(in net.Conn) {
	c := &peerConn{client: in}
	if !p.track(c) {
		return
	}
	defer p.untrack(c)
	head, from, err := readHead(in)
	if err != nil {
		c.close()
		return
	}
	c.from = from
	if !p.pass(c) {
		return
	}
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.close()
		return
	}
	p.mu.Lock()
	closed := p.closed
	if !closed {
		c.server = out
	}
	p.mu.Unlock()
	if closed { // Close already closed the client's side
		_ = out.Close()
		return
	}
	if _, err := out.Write(head); err != nil {
		c.close()
		return
	}
	go p.pipe(c, out, in)
	p.pipe(c, in, out)
}

// readHead reads the first request's head from r and returns every byte it
// read (the head, and maybe more) and the sender's X-PeerURLs, empty when
// it has none.
func readHead(r io.Reader) (read []byte, from string, err error) {
	var buf bytes.Buffer
	tp := textproto.NewReader(bufio.NewReader(io.TeeReader(r, &buf)))
	if _, err := tp.ReadLine(); err != nil {
		return nil, "", err
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return nil, "", err
	}
	return buf.Bytes(), http.Header(h).Get("X-PeerURLs"), nil
}

// pipe copies src to dst until either side closes, holding the bytes while
// the connection's sender is cut.
func (p *PeerProxy) pipe(c *peerConn, dst io.Writer, src io.Reader) {
	defer c.close()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass(c) {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pass waits while c's sender is cut, and reports whether c may go on: a
// connection that was cut is closed when the cut heals.
func (p *PeerProxy) pass(c *peerConn) bool {
	p.mu.Lock()
	cut, healed := p.cutLocked(c.from), p.healed
	p.mu.Unlock()
	if !cut {
		return true
	}
	<-healed
	c.close()
	return false
}

func (p *PeerProxy) track(c *peerConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.client.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *PeerProxy) untrack(c *peerConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// Cut holds, until Heal, every connection opened by a member advertising
// one of peerURLs (its proxy's URL).
func (p *PeerProxy) Cut(peerURLs ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.healed:
		p.healed = make(chan struct{})
	default: // already cut
	}
	for _, u := range peerURLs {
		p.cut[u] = true
	}
}

// Heal ends every cut, closing the connections it held.
func (p *PeerProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.cut)
	select {
	case <-p.healed:
	default:
		close(p.healed)
	}
}

// Close stops the proxy and its connections.
func (p *PeerProxy) Close() {
	p.mu.Lock()
	p.closed = true
	// Under mu: connect sets a connection's server side under it.
	for c := range p.conns {
		c.close()
	}
	p.mu.Unlock()
	p.Heal()
	_ = p.ln.Close()
}

// cutLocked tells whether a sender's X-PeerURLs, a comma-separated list,
// holds a cut URL.
func (p *PeerProxy) cutLocked(from string) bool {
	for _, u := range strings.Split(from, ",") {
		if p.cut[strings.TrimSpace(u)] {
			return true
		}
	}
	return false
}
