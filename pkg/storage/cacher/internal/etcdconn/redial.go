package etcdconn

import (
	"context"
	"errors"
	"net"
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

// Redial returns a dialer that dials again, about a second apart at most
// (redialBackoff), while the address refuses the connection, until ctx
// ends.
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
// Only a refusal is redialled: a member whose host is down drops the
// dial's packets, and the dial itself waits for ctx. Errors other than a
// refusal, and ctx's end, return at once; so does a refusal an egress
// dialer reports as anything but syscall.ECONNREFUSED (a konnectivity
// tunnel's, for one), which keeps gRPC's pace.
//
// Two limits stay gRPC's: between its attempts it still waits its
// backoff, which grows by 1.6 per 20 s attempt, so that past about three
// minutes of outage a member can come back in a wait of up to 2 minutes
// in which nothing dials; and while an attempt lasts, the connection is
// CONNECTING rather than failed, so that an RPC to a single member waits
// for its own deadline instead of failing at once (etcd's client waits
// for a ready connection either way).
func Redial(dial utilnet.DialFunc, clk clock.WithTicker) utilnet.DialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		backoff := redialBackoff
		for {
			c, err := dial(ctx, network, addr)
			if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
				return c, err
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
