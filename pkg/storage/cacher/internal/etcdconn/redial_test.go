package etcdconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

// TestRedial checks which dial errors Redial dials again and how often:
// only a refusal, until the dial succeeds or ctx ends, about a second
// apart at most.
func TestRedial(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	unreachable := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}
	tests := []struct {
		name string
		// errs are the inner dial's answers in turn; then it succeeds.
		errs []error
		// cancel ends ctx after this many dials; 0 never.
		cancel int
		// dials is how many dials are wanted, and ok whether a connection.
		dials int
		ok    bool
	}{
		{name: "connects at once", dials: 1, ok: true},
		{name: "refused, then connects", errs: []error{refused, refused, refused}, dials: 4, ok: true},
		{name: "refused many times, the wait capped", errs: repeat(refused, 12), dials: 13, ok: true},
		{name: "another error returns at once", errs: []error{unreachable, refused}, dials: 1},
		{name: "refused until ctx ends", errs: repeat(refused, 100), cancel: 3, dials: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := testingclock.NewFakeClock(time.Unix(1000, 0))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var dials atomic.Int32
			inner := func(context.Context, string, string) (net.Conn, error) {
				n := int(dials.Add(1))
				if n == tc.cancel {
					cancel()
				}
				if n <= len(tc.errs) {
					return nil, tc.errs[n-1]
				}
				return pipe(t), nil
			}
			// The dials' bounds on a clock of their own: each dial answers
			// at once, and a step of the waits' clock while one lasts
			// would be counted as a wait.
			done := startRedial(ctx, inner, clk, testingclock.NewFakeClock(time.Unix(1000, 0)))
			// Each refused dial is followed by one wait on the clock, of a
			// second and its jitter (20%) at most: a step of 1.2 s ends it
			// and the next dial follows. A longer wait takes more steps
			// than dials.
			steps := 0
			var got redialResult
			for {
				err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
					func(context.Context) (bool, error) { return len(done) == 1 || clk.HasWaiters(), nil })
				if err != nil {
					t.Fatalf("Redial neither returned nor waited; %d dials", dials.Load())
				}
				if len(done) == 1 {
					got = <-done
					break
				}
				clk.Step(1200 * time.Millisecond)
				steps++
			}
			if steps != int(dials.Load())-1 {
				t.Errorf("%d steps of 1.2 s for %d dials: a wait between two dials was longer", steps, dials.Load())
			}
			if int(dials.Load()) != tc.dials {
				t.Errorf("dials = %d, want %d", dials.Load(), tc.dials)
			}
			if (got.err == nil) != tc.ok || (got.c != nil) != tc.ok {
				t.Errorf("conn %v, err %v; want a connection: %v", got.c, got.err, tc.ok)
			}
			if !tc.ok && got.err == nil {
				t.Error("no error")
			}
		})
	}
}

// TestRedialUnanswered: a dial that gets no answer, as to a member whose
// host is down and drops its packets, is ended once dialAttempt passes
// and made again after the wait a refusal gets, until one connects or ctx
// ends; it does not hold the connection attempt until gRPC's deadline.
func TestRedialUnanswered(t *testing.T) {
	for _, tc := range []struct {
		name       string
		unanswered int
		// cancel ends ctx during this dial; 0 never.
		cancel, dials int
		ok            bool
	}{
		{name: "answered at the third dial", unanswered: 2, dials: 3, ok: true},
		{name: "unanswered until ctx ends", unanswered: 100, cancel: 2, dials: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			waits, bounds := testingclock.NewFakeClock(time.Unix(1000, 0)), testingclock.NewFakeClock(time.Unix(1000, 0))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var dials atomic.Int32
			inner := func(ctx context.Context, _, _ string) (net.Conn, error) {
				n := int(dials.Add(1))
				if n <= tc.unanswered {
					if n == tc.cancel {
						cancel()
					}
					<-ctx.Done() // no answer: the dial waits for its context
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
				}
				return pipe(t), nil
			}
			done := startRedial(ctx, inner, waits, bounds)
			var got redialResult
			for {
				err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
					func(context.Context) (bool, error) {
						return len(done) == 1 || bounds.HasWaiters() || waits.HasWaiters(), nil
					})
				if err != nil {
					t.Fatalf("redial neither returned, dialed nor waited; %d dials", dials.Load())
				}
				if len(done) == 1 {
					got = <-done
					break
				}
				if bounds.HasWaiters() {
					bounds.Step(dialAttempt)
				} else {
					waits.Step(1200 * time.Millisecond)
				}
			}
			if int(dials.Load()) != tc.dials {
				t.Errorf("dials = %d, want %d", dials.Load(), tc.dials)
			}
			if (got.err == nil) != tc.ok || (got.c != nil) != tc.ok {
				t.Errorf("conn %v, err %v; want a connection: %v", got.c, got.err, tc.ok)
			}
		})
	}
}

// redialResult is what a dial of redial's returned.
type redialResult struct {
	c   net.Conn
	err error
}

// startRedial dials through redial, with its waits on clk and its dials'
// bounds on bounds, on a goroutine of its own, and returns where the
// result arrives.
func startRedial(ctx context.Context, dial utilnet.DialFunc, clk, bounds clock.WithTicker) <-chan redialResult {
	done := make(chan redialResult, 1)
	go func() {
		c, err := redial(dial, clk, bounds)(ctx, "tcp", "etcd:2379")
		done <- redialResult{c, err}
	}()
	return done
}

// pipe returns a connection that needs no network, closed when the test
// ends.
func pipe(t *testing.T) net.Conn {
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	return client
}

func repeat(err error, n int) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// TestRedialRealRefusal checks Redial against a real loopback port: a
// refusal from the kernel is recognised, and a listener that opens later is
// reached within the capped wait of its opening.
func TestRedialRealRefusal(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: dials are refused
	if _, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a dial to a closed port: %v, want a refusal", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		c, err := Redial(nil, nil)(ctx, "tcp", addr)
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Redial returned while nothing listened: %v", err)
	case <-time.After(1500 * time.Millisecond): // past the first few dials
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(fmt.Errorf("listening again on %s: %w", addr, err))
	}
	defer ln.Close()
	opened := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(opened); d > 4*time.Second {
			t.Errorf("reached %v after the listener opened, want within 1.2 s and the dial (4 s on a loaded machine)", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Redial did not reach the listener within 10 s of its opening")
	}
}
