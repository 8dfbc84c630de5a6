package etcdconn

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// redialBackoff paces the dials of one connection attempt to a member that
// refuses: 100 ms, then 1.6 times longer each time, up to a second, each
// wait up to 20% longer at random. It is
// etcdReconnect's pacing (the cache's own client), for clients whose gRPC
// pacing we do not set.
var redialBackoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 1.6, Jitter: 0.2, Cap: time.Second, Steps: 1 << 30}

// dialAttempt bounds the first dial of Redial's, and doubles for each
// dial that runs out of it within one of gRPC's connection attempts. A
// dial that reaches its host is answered within a round trip, which this
// leaves room for many times over; the kernel sends its SYN again 1 s
// after the first, so that a dial within the bound tries twice. Doubling
// lets a dial that needs longer (a name server that does not answer, with
// Go's resolver trying the next after 5 s; an address after one that does
// not answer) through within twice its time.
const dialAttempt = 2 * time.Second

// Redial returns a dialer that dials again, about a second apart at most
// (redialBackoff), while the address refuses the connection or does not
// answer within dialAttempt, until ctx ends.
//
// A killed or restarting etcd member refuses connections. gRPC then waits
// before its next attempt: 1 s, 1.6 times longer after each failure, up to
// 2 minutes. That is how long the etcd3 store's client and the
// storage-readiness check's client wait, whose gRPC options the generic
// storage factory sets and only their dialer is ours
// (storagebackend.TransportConfig.EgressLookup). After a member is back
// from a 54 s outage, writes and /readyz's etcd check waited 12–17 s
// (docs/reliability.md). With Redial a connection attempt lasts as long
// as gRPC's connect timeout (20 s) and is answered within a second of
// the member's return. gRPC's own backoff then counts one failure per
// 20 s of outage, not one per attempt.
//
// A member whose host is down drops the dial's packets, and a dial to it
// waits for ctx, gRPC's connect timeout of 20 s, however soon the host is
// back: each dial is bounded, from dialAttempt on, and one that runs out
// is made again as after a refusal. Errors other than a refusal, and ctx's
// end, return at once; so does a refusal an egress dialer reports as
// anything but syscall.ECONNREFUSED (a konnectivity tunnel's, for one),
// which keeps gRPC's pace.
//
// Two limits stay gRPC's: between its attempts it still waits its
// backoff, which grows by 1.6 per 20 s attempt, so that past about three
// minutes of outage a member can come back in a wait of up to 2 minutes
// in which nothing dials; and while an attempt lasts, the connection is
// CONNECTING rather than failed, so that an RPC to a single member waits
// for its own deadline instead of failing at once (etcd's client waits
// for a ready connection either way).
func Redial(dial utilnet.DialFunc, clk clock.WithTicker) utilnet.DialFunc {
	return redial(dial, clk, clk)
}

// redial is Redial with the bound of each dial on a clock of its own,
// bounds, so that a test can tell the dials' bounds from the waits
// between them.
func redial(dial utilnet.DialFunc, clk, bounds clock.WithTicker) utilnet.DialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	if bounds == nil {
		bounds = clk
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		backoff := redialBackoff
		bound := dialAttempt
		for {
			c, ranOut, err := dialBounded(ctx, dial, bounds, bound, network, addr)
			if err == nil || ctx.Err() != nil || !ranOut && !errors.Is(err, syscall.ECONNREFUSED) {
				return c, err
			}
			if ranOut {
				// A dial that needs longer (a slow name server, an
				// address after one that does not answer) gets it.
				bound *= 2
			}
			t := clk.NewTimer(backoff.Step())
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, err
			case <-t.C():
			}
		}
	}
}

// dialBounded dials addr for bound at most, and tells whether the dial
// ran out of it.
func dialBounded(ctx context.Context, dial utilnet.DialFunc, clk clock.WithTicker, bound time.Duration, network, addr string) (net.Conn, bool, error) {
	attempt, cancel := context.WithCancel(ctx)
	defer cancel()
	t := clk.NewTimer(bound)
	defer t.Stop()
	var ranOut atomic.Bool
	go func() {
		select {
		case <-t.C():
			ranOut.Store(true)
			cancel()
		case <-attempt.Done():
		}
	}()
	c, err := dial(attempt, network, addr)
	return c, ranOut.Load(), err
}
