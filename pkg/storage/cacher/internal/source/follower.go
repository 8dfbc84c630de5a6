package source

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
)

// Delays between attempts to re-open the etcd watch. While the member has
// no leader each attempt fails at once, so the cache retries at the cap:
// 250 ms keeps events flowing within a quarter second of etcd recovering,
// at four rejected stream openings a second per resource (upstream's
// reflector retries without any delay). A write through this cache that
// succeeds proves etcd has a leader again and cuts the wait short, to at
// least the minimum.
const (
	minRewatchDelay = 25 * time.Millisecond
	// syncPollEvery and syncPolls bound how a new watch asks for progress
	// until it hears something (follower.watch): etcd's 100 ms sync, and
	// three of them.
	syncPollEvery   = 20 * time.Millisecond
	syncPolls       = 15
	maxRewatchDelay = 250 * time.Millisecond
	// noLeaderRewatchDelay caps the wait after a member said it has no
	// leader (rewatchDelay).
	noLeaderRewatchDelay = 50 * time.Millisecond
)

// Handler takes one response from the watch; stop ends the watch, with end.
type Handler func(Response) (end End, stop bool)

// follower keeps a cache on etcd's stream of changes: it watches, and
// re-watches from the cache's head whenever a watch ends without losing
// history, a silent one included.
type follower struct {
	cfg Config
	// head is the newest resourceVersion the cache holds: a watch
	// re-opened starts after it.
	head func() uint64
	// answered is signalled when a request through the cache reached etcd
	// and succeeded: a re-watch waiting for etcd to recover tries at once.
	answered chan struct{}
	// asked carries readers' requests for a progress notification to the
	// goroutine of the watch that follows etcd, which makes them on its
	// own stream (askProgress).
	asked chan struct{}
	// outage tracks time without a watch; only Follow's goroutine uses it.
	outage outage
}

func newFollower(cfg Config, head func() uint64) *follower {
	f := &follower{cfg: cfg, head: head, answered: make(chan struct{}, 1), asked: make(chan struct{}, 1)}
	f.outage.f = f
	return f
}

// errRelistRequested ends the watch when the consistency check asks for a relist.
var errRelistRequested = errors.New("the consistency check found the cache differing from etcd")

// follow passes every event from rv on to handle: it watches, and whenever
// the watch ends without losing history it watches again from the head.
// It returns only when the cache must re-list, because handle or a reason
// sent on relist says so or etcd lost the history, or ctx ends.
func (f *follower) follow(ctx context.Context, rv uint64, relist <-chan string, handle Handler) End {
	backoff := rewatchBackoff()
	for {
		progressed := false
		end := f.watch(ctx, rv, relist, f.asked, handle, func() {
			if !progressed {
				progressed = true
				f.outage.restored(ctx)
			}
		}, f.head, false)
		if ctx.Err() != nil {
			return end
		}
		f.outage.lost(end)
		if end.Relist {
			return end
		}
		f.cfg.Metrics.Restarted(end.Reason)
		if progressed {
			backoff = rewatchBackoff()
		}
		if err := f.waitToRewatch(ctx, rewatchDelay(end, backoff)); err != nil {
			return End{Reason: EndClosed, Err: err}
		}
		if end.Quiet > 0 {
			f.dropQuiet(end.Quiet)
		}
		rv = f.head()
	}
}

// waitToRewatch waits delay before the next attempt to watch, or less
// once etcd answers a request through the cache.
func (f *follower) waitToRewatch(ctx context.Context, delay time.Duration) error {
	// An answer from before the failure proves nothing.
	select {
	case <-f.answered:
	default:
	}
	timer := f.cfg.Clock.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C():
		return nil
	case <-f.answered:
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-f.cfg.Clock.After(minRewatchDelay):
		return nil
	}
}

// answer notes that etcd answered a request, when err is nil: see
// Source.Answered.
func (f *follower) answer(err error) error {
	if err == nil {
		select {
		case f.answered <- struct{}{}:
		default:
		}
	}
	return err
}

// rewatchDelay is the wait before the watch that replaces one that ended
// with end. A member without a leader refuses a watch at once: trying every
// noLeaderRewatchDelay costs it a refused stream each time, and finds the
// new leader within that of its election, where the backoff's 250 ms made
// ours recover from a leader loss later than upstream's, whose reflector
// retries at once (issue 65, item 6).
func rewatchDelay(end End, backoff *wait.Backoff) time.Duration {
	delay := backoff.Step()
	if end.Reason == EndNoLeader {
		delay = min(delay, noLeaderRewatchDelay)
	}
	return delay
}

func rewatchBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: minRewatchDelay, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: maxRewatchDelay}
}

// watch follows etcd from rv, passing every response to handle, until
// the watch or handle ends it, or a re-list is requested on relist. It asks
// etcd for progress on its own stream when told on asked. alive is called
// on every response, and whenever etcd confirms it holds nothing newer
// than position, the newest revision the watch's reader holds. replaying
// names the watch's failpoint: the replay's, or the follower's.
func (f *follower) watch(ctx context.Context, rv uint64, relist <-chan string, asked <-chan struct{}, handle Handler, alive func(),
	position func() uint64, replaying bool) End {
	stream := f.cfg.Changes.Watch(ctx, rv)
	defer stream.Close()
	// A progress notification proves the new watch is live, so that
	// the outage ends as soon as etcd answers, not with the next write.
	// Asking only queues a request on the watch's stream; on a stalled
	// connection it gives up after a second, and the silence check asks again.
	f.requestProgress(stream)
	// etcd drops that request while it catches the new watch up (it syncs
	// watches that start in the past every 100 ms): until a watch that
	// replaces one lost in an outage hears something, it asks again every
	// syncPollEvery, so that an idle resource's outage ends within that of
	// etcd's sync, not a reader's retry (100 ms) later. A watch that
	// follows a list starts at etcd's revision, with nothing to catch up,
	// and does not poll: it would only report revisions of other resources
	// early (upstream's RunTestConsistentList expects a list at 0 right
	// after a write to another key not to see it).
	polls := syncPolls
	if !replaying && !f.outage.since.IsZero() {
		polls = 0
	}
	syncPoll := f.cfg.Clock.NewTimer(syncPollEvery)
	defer syncPoll.Stop()

	check := newSilence(f.cfg.ProgressRequestInterval, f.cfg.Clock.Now())
	ticks := f.cfg.Clock.NewTicker(check.period())
	defer ticks.Stop()
	heard, first := false, true
	// heardAny is whether the watch heard anything since it opened.
	heardAny := false
	// stalled, set by a failpoint, drops every response from then on.
	stalled := false
	for {
		select {
		case <-ctx.Done():
			return End{Reason: EndClosed, Err: ctx.Err()}
		case reason := <-relist:
			return End{Reason: reason, Relist: true, Err: errRelistRequested}
		case now := <-ticks.C():
			if err := inject.Hit(ctx, inject.SilenceCheck); err != nil {
				return End{Reason: EndSilent, Err: err}
			}
			if first && !heard && f.idle(position) {
				// An idle etcd leaves the request above unanswered (see
				// idle): the outage ends when etcd confirms there is
				// nothing to hear, not an interval later.
				alive()
			}
			first = false
			ask, silent := check.tick(now, heard)
			heard = false
			if ask {
				f.requestProgress(stream)
			}
			if silent && f.idle(position) {
				check.idle(now)
				alive()
				continue
			}
			if silent {
				return f.silent(check.quiet(now))
			}
		case <-asked:
			f.requestProgress(stream)
		case <-syncPoll.C():
			if polls++; !heardAny && polls < syncPolls {
				f.requestProgress(stream)
				syncPoll.Reset(syncPollEvery)
			}
		case r, ok := <-stream.Responses():
			if !ok {
				return End{Reason: EndClosed, Err: fmt.Errorf("the etcd watch of %s closed", f.cfg.GroupResource)}
			}
			if stalled {
				continue
			}
			heard, heardAny = true, true
			if r.End == nil {
				// Heard before it is applied: the outage is over
				// before a watcher can see what the new watch brought.
				alive()
			}
			if inject.Enabled {
				failpoint := inject.WatchResponse
				if replaying {
					failpoint = inject.Replay
				}
				switch err := inject.Hit(ctx, failpoint); {
				case errors.Is(err, inject.ErrStall):
					stalled, heard = true, false
					continue
				case errors.Is(err, inject.ErrRepeat) && r.End == nil:
					if end, stop := handle(r); stop {
						return end
					}
				case errors.Is(err, inject.ErrEndWatch):
					return End{Reason: EndClosed, Err: err}
				case err != nil:
					return End{Reason: EndUnavailable, Err: err}
				}
			}
			if end, stop := handle(r); stop {
				return end
			}
		}
	}
}

// idle reports whether etcd holds nothing newer than position, the newest
// revision the watch's reader holds (the cache's head, for the watch that
// follows etcd), so that a watch that did not answer a progress request
// had nothing to say.
// etcd answers a progress request only once its revision has reached the
// start of every watch on the stream (progressIfSync in its watchable
// store). A watch opened at the head of an idle etcd starts one past its
// revision, and hears nothing, not even an answer, until the next write:
// without this, an idle cache found its watch silent every 8 s, and closed
// its connections to etcd each time. A silent member still fails this: it
// does not answer, or another member has the write the watch did not
// deliver.
func (f *follower) idle(position func() uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rev, err := f.cfg.Store.GetCurrentResourceVersion(ctx)
	if err != nil {
		klog.V(4).InfoS("Reading etcd's revision for a quiet watch failed", "resource", f.cfg.GroupResource, "err", err)
		return false
	}
	return rev <= position()
}

// silent ends a watch that heard nothing for quiet. A watch re-opened on
// the same connection would be as silent, so the connections to etcd that
// have been as quiet are closed before the next one (dropQuiet).
func (f *follower) silent(quiet time.Duration) End {
	return End{Reason: EndSilent, Quiet: quiet,
		Err: fmt.Errorf("no event or progress notification from etcd for %v", quiet)}
}

// dropQuiet closes the connections to etcd that have received nothing for
// quiet (Config.Connections): etcd's client then re-opens its streams on a
// connection to a member that answers. It runs once the silent watch has
// ended and the wait before the next has passed, not as the watch ends:
// etcd's client, resuming a broken stream's watches on a new connection,
// can re-create there a watch ended at that moment without ever
// cancelling it, which then lingers on etcd, and its stream in the client.
// Ended 25 ms before its connection closed, none of 40 watches did; ended
// at once, 5 to 9 did.
func (f *follower) dropQuiet(quiet time.Duration) {
	if f.cfg.Connections == nil {
		return
	}
	n := f.cfg.Connections.DropQuiet(quiet)
	klog.InfoS("Closed the connections to etcd as quiet as the silent watch", "resource", f.cfg.GroupResource,
		"quiet", quiet, "closed", n)
}

// outage is the time the cache spends without a working etcd watch: from
// the watch failing until a new one delivers an event or a progress
// notification. Only the ingest goroutine uses it.
type outage struct {
	f *follower
	// since is when the watch was lost; zero while it works.
	since time.Time
}

// lost records a failed watch. The first failure of an outage is logged at
// info level; the retries that follow, once a second at most, at V(2).
func (o *outage) lost(end End) {
	f := o.f
	if !o.since.IsZero() {
		klog.V(2).InfoS("Watch cache's etcd watch failed again", "resource", f.cfg.GroupResource, "reason", end.Reason, "err", end.Err)
		return
	}
	o.since = f.cfg.Clock.Now()
	if end.Relist {
		return // Run logs the re-list.
	}
	klog.InfoS("Watch cache lost its etcd watch; re-watching from its head while watchers stay open",
		"resource", f.cfg.GroupResource, "reason", end.Reason, "head", f.head(), "err", end.Err)
}

// restored ends an outage, if one is under way.
func (o *outage) restored(ctx context.Context) {
	if o.since.IsZero() {
		return
	}
	f := o.f
	_ = inject.Hit(ctx, inject.OutageEnd)
	gap := f.cfg.Clock.Since(o.since)
	o.since = time.Time{}
	f.cfg.Metrics.Gap.Observe(gap.Seconds())
	klog.InfoS("Watch cache's etcd watch is back", "resource", f.cfg.GroupResource, "after", gap)
}

// askProgress has the watch following etcd ask for a progress
// notification, on its own stream, without waiting: see
// Source.RequestProgress.
func (f *follower) askProgress() {
	select {
	case f.asked <- struct{}{}:
	default: // One is already pending.
	}
}

// requestProgress asks etcd for a progress notification on stream's own
// gRPC stream. Asking only queues a request on the stream: on a stalled
// connection it gives up after a second.
func (f *follower) requestProgress(stream ChangeStream) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := stream.RequestProgress(ctx); err != nil {
		klog.V(4).InfoS("Requesting watch progress failed", "resource", f.cfg.GroupResource, "err", err)
	}
}
