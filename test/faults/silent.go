package faults

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// silentBound is issue 28's bound for a member gone silent: our streams
// deliver again within 12 s of the blackhole starting. The cache finds its
// watch silent within 8 s, 9 if the member does not answer the revision
// read that tells a silent watch from an idle etcd
// (pkg/storage/cacher/internal/source/silence.go), closes the
// quiet connections and re-watches through a member that answers.
const silentBound = 12 * time.Second

// silentResult is what the member-gone-silent scenario measured.
type silentResult struct {
	// member is the blackholed member.
	member int
	// deliveredAgain is how long after the blackhole started every
	// unselective stream had received a write made after it; zero if none
	// did while the blackhole lasted.
	deliveredAgain time.Duration
	// failedAfter and writesAfter count the writes that started between a
	// second after deliveredAgain and the heal, and those of them that
	// failed: once the cache has moved off the silent member, requests
	// must have too, or one in three (gRPC's round robin) waits there
	// until keepalive and times out. failedBefore counts the failed writes
	// before that.
	failedAfter, writesAfter, failedBefore int
}

// memberSilent blackholes, for d, the proxy of the member carrying the
// server's etcd watch of assignments, with the server given all three
// members: bytes stop both ways and the connections stay open, so that
// only gRPC's keepalive (30 s and 10 s in the storage factory's settings)
// or the cache's own silence check notices. That member is the one whose
// proxy forwards the server the most bytes: the watch gets every write,
// with its previous value, while requests spread over the members.
func memberSilent(d time.Duration) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		busiest, sent := e.busiestProxy(ctx, 2*time.Second)
		start := time.Now()
		e.proxies[busiest].Blackhole()
		// Only a change committed after the blackhole began proves a new
		// connection: the ones before it may have passed the proxy already.
		from, err := e.cluster.head(ctx)
		if err != nil {
			e.proxies[busiest].Heal()
			return err
		}
		res := &silentResult{member: busiest}
		err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, d, true, func(context.Context) (bool, error) {
			return e.unselectiveReached(from + 1), nil
		})
		if err == nil {
			res.deliveredAgain = time.Since(start)
		}
		hold(ctx, time.Until(start.Add(d)))
		healed := time.Now()
		e.proxies[busiest].Heal()
		if res.deliveredAgain != 0 {
			moved := start.Add(res.deliveredAgain + time.Second)
			res.failedBefore, _ = e.writer.failedBetween(start, moved)
			res.failedAfter, res.writesAfter = e.writer.failedBetween(moved, healed)
		}
		e.silent = res
		e.notef("member %d silent for %v (bytes its proxy sent the server in 2 s, by member: %v): the streams got events again %v after it went silent (0: not before the heal); writes failed before then: %d, after: %d of %d",
			busiest+1, d, sent, res.deliveredAgain.Round(time.Millisecond), res.failedBefore, res.failedAfter, res.writesAfter)
		// The run proves nothing unless the blackhole reached the watch.
		if res.deliveredAgain != 0 && res.deliveredAgain < time.Second {
			return fmt.Errorf("the streams went on %v into the blackhole of member %d: the server's watch was elsewhere", res.deliveredAgain, busiest+1)
		}
		return nil
	}
}

// busiestProxy returns which proxy forwards the server the most bytes over
// window, and what each forwarded.
func (e *env) busiestProxy(ctx context.Context, window time.Duration) (busiest int, sent []int64) {
	before := make([]int64, len(e.proxies))
	for i, p := range e.proxies {
		before[i] = p.ToClients()
	}
	hold(ctx, window)
	for i, p := range e.proxies {
		sent = append(sent, p.ToClients()-before[i])
		if sent[i] > sent[busiest] {
			busiest = i
		}
	}
	return busiest, sent
}

// unselectiveReached tells whether every stream without a selector has
// delivered resourceVersion rv or later.
func (e *env) unselectiveReached(rv int64) bool {
	for _, s := range e.streams {
		if s.spec.sel == (selector{}) && s.lastRV() < rv {
			return false
		}
	}
	return true
}
