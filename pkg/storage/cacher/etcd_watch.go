package cacher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/klog/v2"
)

// Why the cache's etcd watch ended: the reason label of the restart and
// relist metrics. The set is closed so that the metrics stay bounded.
const (
	// endClosed: the watch ended without an error, as when etcd or the
	// connection to it closes the stream.
	endClosed = "closed"
	// endSilent: no event and no progress notification for a progress
	// request interval, and no answer when asked for one (silence.go). A
	// blackholed connection looks like this and may never return an error.
	endSilent = "silent"
	// endNoLeader: the etcd member the server talks to lost its leader
	// (the etcd3 store watches with WithRequireLeader).
	endNoLeader = "no_leader"
	// endUnavailable: any other error from etcd's client or server.
	endUnavailable = "etcd_unavailable"
	// endCompacted: etcd compacted the revision the cache was at. The only
	// reason etcd itself gives to re-list.
	endCompacted = "compacted"
	// endUnreadable: an event the cache could not decode or ingest. The
	// history holds it, so re-watching would fail on it again.
	endUnreadable = "unreadable"
	// endInconsistent: the consistency check found the cache differing from etcd.
	endInconsistent = "inconsistent"
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
	maxRewatchDelay = 250 * time.Millisecond
)

// watchEnd is why one etcd watch ended and what the cache does next.
type watchEnd struct {
	reason string
	// relist is whether the events after the head may be lost to the
	// cache: then it lists again and ends its watchers. Otherwise it
	// re-opens the watch from its head and no watcher notices.
	relist bool
	err    error
}

func (e watchEnd) Error() string { return fmt.Sprintf("%s: %v", e.reason, e.err) }

// classifyWatchError decides what an error event from the etcd3 store's
// watch means. The store turns etcd's errors into API statuses:
// ErrCompacted becomes 410 Expired, a corrupt object's deletion becomes
// StoreReadError, and everything else, etcd's errors and decode failures
// alike, becomes InternalError with the original message. etcd's own errors
// are told apart by their message: etcd's client spells every server error
// "etcdserver: …" and every transport error "rpc error: code = …".
func classifyWatchError(err error) watchEnd {
	status, ok := err.(apierrors.APIStatus)
	if !ok {
		status = apierrors.NewInternalError(err)
	}
	s := status.Status()
	switch {
	case s.Code == 410 || s.Reason == metav1.StatusReasonExpired || s.Reason == metav1.StatusReasonGone:
		return watchEnd{reason: endCompacted, relist: true, err: err}
	case s.Reason == metav1.StatusReasonStoreReadError:
		return watchEnd{reason: endUnreadable, relist: true, err: err}
	case strings.Contains(s.Message, rpctypes.ErrNoLeader.Error()):
		return watchEnd{reason: endNoLeader, err: err}
	case strings.Contains(s.Message, "etcdserver: "), strings.Contains(s.Message, "rpc error: code = "),
		strings.Contains(s.Message, context.DeadlineExceeded.Error()):
		return watchEnd{reason: endUnavailable, err: err}
	default:
		// Most likely an object that does not decode. Re-watching would
		// meet it again; a list reads the current state instead.
		return watchEnd{reason: endUnreadable, relist: true, err: err}
	}
}

// errRelistRequested ends the watch when the consistency check asks for a relist.
var errRelistRequested = errors.New("the consistency check found the cache differing from etcd")

// follow keeps the cache on etcd's stream of changes from rv on: it
// watches, and whenever the watch ends without losing history it watches
// again from the head. It returns only when the cache must re-list, or ctx ends.
func (c *Cacher) follow(ctx context.Context, rv uint64) watchEnd {
	backoff := c.rewatchBackoff()
	for {
		progressed := false
		end := c.watch(ctx, rv, func(watch.Event) {
			if !progressed {
				progressed = true
				c.outage.restored()
			}
		})
		if ctx.Err() != nil {
			return end
		}
		c.outage.lost(end)
		if end.relist {
			return end
		}
		c.metrics.restart(end.reason)
		if progressed {
			backoff = c.rewatchBackoff()
		}
		if err := c.waitToRewatch(ctx, backoff.Step()); err != nil {
			return watchEnd{reason: endClosed, err: err}
		}
		_, rv = c.log.Bounds()
	}
}

// waitToRewatch waits delay before the next attempt to watch, or less
// once etcd answers a request through this cache.
func (c *Cacher) waitToRewatch(ctx context.Context, delay time.Duration) error {
	// An answer from before the failure proves nothing.
	select {
	case <-c.etcdAnswered:
	default:
	}
	timer := c.cfg.Clock.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C():
		return nil
	case <-c.etcdAnswered:
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.cfg.Clock.After(minRewatchDelay):
		return nil
	}
}

// etcdAnsweredOK notes that etcd answered a request, when err is nil, so
// that a re-watch waiting for etcd to recover need not wait out its delay.
func (c *Cacher) etcdAnsweredOK(err error) error {
	if err == nil {
		select {
		case c.etcdAnswered <- struct{}{}:
		default:
		}
	}
	return err
}

func (c *Cacher) rewatchBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: minRewatchDelay, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: maxRewatchDelay}
}

// watch follows etcd from rv until the watch ends, and says why it ended.
// alive is called on every event and progress notification.
func (c *Cacher) watch(ctx context.Context, rv uint64, alive func(watch.Event)) watchEnd {
	return c.watchWith(ctx, rv, c.relistRequests, c.handle, alive)
}

// watchWith follows etcd from rv, passing every event to handle, until the
// watch or handle ends it, or a re-list is requested on relist.
func (c *Cacher) watchWith(ctx context.Context, rv uint64, relist <-chan string,
	handle func(watch.Event) (watchEnd, bool), alive func(watch.Event)) watchEnd {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := c.cfg.Storage.Watch(wctx, c.cfg.ResourcePrefix, storage.ListOptions{
		ResourceVersion: fmt.Sprint(rv),
		Recursive:       true,
		ProgressNotify:  true,
		// Each event carries when the store decoded it, for the dispatch latency.
		RecordTimestamps: true,
		Predicate: storage.SelectionPredicate{
			Label: labels.Everything(), Field: fields.Everything(), AllowWatchBookmarks: true,
		},
	})
	if err != nil {
		return classifyWatchError(err)
	}
	defer w.Stop()
	// A progress notification proves the new watch is live, so that
	// the outage ends as soon as etcd answers, not with the next write.
	// Asking only queues a request on the watch's stream; on a stalled
	// connection it gives up after a second, and the silence check asks again.
	c.requestProgressWithin(time.Second)

	check := newSilence(c.cfg.ProgressRequestInterval, c.cfg.Clock.Now())
	ticks := c.cfg.Clock.NewTicker(check.period())
	defer ticks.Stop()
	heard := false
	for {
		select {
		case <-ctx.Done():
			return watchEnd{reason: endClosed, err: ctx.Err()}
		case reason := <-relist:
			return watchEnd{reason: reason, relist: true, err: errRelistRequested}
		case now := <-ticks.C():
			ask, silent := check.tick(now, heard)
			heard = false
			if ask {
				c.requestProgressWithin(time.Second)
			}
			if silent {
				return c.silent(check.quiet(now))
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				return watchEnd{reason: endClosed, err: fmt.Errorf("the etcd watch of %s closed", c.cfg.GroupResource)}
			}
			heard = true
			if end, stop := handle(ev); stop {
				return end
			}
			alive(ev)
		}
	}
}

// silent ends a watch that heard nothing for quiet. A watch re-opened on
// the same connection would be as silent, so the connections to etcd that
// have been as quiet are closed first (Config.Connections): etcd's client
// then re-opens its streams on a connection to a member that answers.
func (c *Cacher) silent(quiet time.Duration) watchEnd {
	dropped := 0
	if c.cfg.Connections != nil {
		dropped = c.cfg.Connections.DropQuiet(quiet)
	}
	return watchEnd{reason: endSilent,
		err: fmt.Errorf("no event or progress notification from etcd for %v; closed %d connections to etcd as quiet", quiet, dropped)}
}

// handle applies one event from the etcd watch. stop is true when the
// event ends the watch.
func (c *Cacher) handle(ev watch.Event) (end watchEnd, stop bool) {
	var decoded time.Time
	ev, decoded = unwrapRecordTime(ev)
	switch ev.Type {
	case watch.Bookmark:
		rv, err := c.cfg.Versioner.ObjectResourceVersion(ev.Object)
		if err != nil {
			return watchEnd{reason: endUnreadable, relist: true, err: err}, true
		}
		c.d.Progress(rv)
	case watch.Added, watch.Modified, watch.Deleted:
		if err := c.ingest(ev, decoded); err != nil {
			return watchEnd{reason: endUnreadable, relist: true, err: err}, true
		}
	case watch.Error:
		return classifyWatchError(apierrors.FromObject(ev.Object)), true
	}
	return watchEnd{}, false
}

// unwrapRecordTime takes the object out of the wrapper the etcd3 store puts
// around it for RecordTimestamps, and returns when the store decoded it.
func unwrapRecordTime(ev watch.Event) (watch.Event, time.Time) {
	if timed, ok := ev.Object.(storage.WatchEventWithRecordTime); ok {
		ev.Object = timed.Unwrap()
		return ev, timed.RecordTime()
	}
	return ev, time.Time{}
}

// requestRelist makes the cache list again, ending its watchers, as when
// the consistency check finds it wrong. It does not wait.
func (c *Cacher) requestRelist(reason string) {
	select {
	case c.relistRequests <- reason:
	default: // One is already pending.
	}
}

// outage is the time the cache spends without a working etcd watch: from
// the watch failing until a new one delivers an event or a progress
// notification. Only the ingest goroutine uses it.
type outage struct {
	cache *Cacher
	// since is when the watch was lost; zero while it works.
	since time.Time
}

// lost records a failed watch. The first failure of an outage is logged at
// info level; the retries that follow, once a second at most, at V(2).
func (o *outage) lost(end watchEnd) {
	c := o.cache
	if !o.since.IsZero() {
		klog.V(2).InfoS("Watch cache's etcd watch failed again", "resource", c.cfg.GroupResource, "reason", end.reason, "err", end.err)
		return
	}
	o.since = c.cfg.Clock.Now()
	klog.InfoS("Watch cache lost its etcd watch; re-watching from its head while watchers stay open",
		"resource", c.cfg.GroupResource, "reason", end.reason, "err", end.err)
}

// restored ends an outage, if one is under way.
func (o *outage) restored() {
	if o.since.IsZero() {
		return
	}
	c := o.cache
	gap := c.cfg.Clock.Since(o.since)
	o.since = time.Time{}
	c.metrics.watchGap.Observe(gap.Seconds())
	klog.InfoS("Watch cache's etcd watch is back", "resource", c.cfg.GroupResource, "after", gap)
}
