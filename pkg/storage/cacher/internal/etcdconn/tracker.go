// Package etcdconn keeps the connections the etcd clients of one resource
// make, its etcd3 store's and its cache's, so that the cache can close the
// ones that went quiet without touching another resource's.
//
// A member that stops answering (a blackhole, a partition TCP survives, a
// hung process) leaves its connections open: gRPC notices only when its
// keepalive fails, 40 s later with the storage factory's settings. Until
// then every watch stream on such a connection stays silent and a
// re-opened watch joins it and stays silent too, and one request in three
// (gRPC's round robin) waits on it. Closing the connection ends all of
// them with Unavailable at once: etcd's client re-opens its watch streams
// on a connection that is READY, and gRPC marks a new connection to the
// silent member READY only once the member sends its HTTP/2 preface, so
// nothing is sent there while it stays silent.
//
// The storage factory dials through TransportConfig.EgressLookup, which
// is how Tracker sees every connection:
//
//	t := etcdconn.New(etcdconn.Config{})
//	config.Transport.EgressLookup = t.Lookup
//	...
//	t.DropQuiet(8 * time.Second) // when a watch heard nothing for 8 s
package etcdconn

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/utils/clock"
)

// Config configures a Tracker.
type Config struct {
	// Dial makes the connections. Default: a net.Dialer's DialContext.
	Dial utilnet.DialFunc
	// Clock tells when a connection last received bytes. Default: the real one.
	Clock clock.PassiveClock
}

// Tracker dials etcd and remembers every open connection it made, with
// when each last received bytes.
type Tracker struct {
	dial  utilnet.DialFunc
	clock clock.PassiveClock

	// mu guards conns.
	mu    sync.Mutex
	conns map[*conn]struct{}
}

// New returns a Tracker.
func New(cfg Config) *Tracker {
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Tracker{dial: cfg.Dial, clock: cfg.Clock, conns: map[*conn]struct{}{}}
}

// Lookup is an egressselector.Lookup that dials through the Tracker, for
// storagebackend.TransportConfig.EgressLookup.
func (t *Tracker) Lookup(egressselector.NetworkContext) (utilnet.DialFunc, error) {
	return t.Dial, nil
}

// Dial connects to addr and keeps the connection until it is closed.
func (t *Tracker) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	inner, err := t.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: inner, tracker: t}
	c.lastRead.Store(t.clock.Now().UnixNano())
	t.mu.Lock()
	t.conns[c] = struct{}{}
	t.mu.Unlock()
	return c, nil
}

// DropQuiet closes every connection that has received nothing for quiet
// or longer, counting from its dial for one that never did, and returns
// how many it closed.
func (t *Tracker) DropQuiet(quiet time.Duration) int {
	cutoff := t.clock.Now().Add(-quiet).UnixNano()
	var quietConns []*conn
	t.mu.Lock()
	for c := range t.conns {
		if c.lastRead.Load() <= cutoff {
			quietConns = append(quietConns, c)
		}
	}
	t.mu.Unlock()
	for _, c := range quietConns {
		_ = c.Close()
	}
	return len(quietConns)
}

// Open returns how many of its connections are open.
func (t *Tracker) Open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// conn is one tracked connection.
type conn struct {
	net.Conn
	tracker *Tracker
	// lastRead is when a Read last returned bytes, in Unix nanoseconds.
	lastRead atomic.Int64
}

func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.lastRead.Store(c.tracker.clock.Now().UnixNano())
	}
	return n, err
}

func (c *conn) Close() error {
	c.tracker.mu.Lock()
	delete(c.tracker.conns, c)
	c.tracker.mu.Unlock()
	return c.Conn.Close()
}
