package source

import (
	"fmt"
	"time"
)

// Why the cache's etcd watch ended: the reason label of the restart and
// relist metrics. The set is closed so that the metrics stay bounded.
const (
	// EndClosed: the watch ended without an error, as when etcd or the
	// connection to it closes the stream.
	EndClosed = "closed"
	// EndSilent: no event and no progress notification for a progress
	// request interval, and no answer when asked for one (silence.go). A
	// blackholed connection looks like this and may never return an error.
	EndSilent = "silent"
	// EndNoLeader: the etcd member the server talks to lost its leader
	// (the cache watches with WithRequireLeader, as the etcd3 store).
	EndNoLeader = "no_leader"
	// EndUnavailable: any other error from etcd's client or server.
	EndUnavailable = "etcd_unavailable"
	// EndCompacted: etcd compacted the revision the cache was at. The only
	// reason etcd itself gives to re-list.
	EndCompacted = "compacted"
	// EndUnreadable: an event the cache could not decode or ingest. The
	// history holds it, so re-watching would fail on it again.
	EndUnreadable = "unreadable"
	// EndInconsistent: the consistency check found the cache differing from etcd.
	EndInconsistent = "inconsistent"
)

// End is why one etcd watch ended and what the cache does next.
type End struct {
	// Reason is one of the End* reasons above.
	Reason string
	// Relist is whether the events after the head may be lost to the
	// cache: then it lists again and ends its watchers. Otherwise it
	// re-opens the watch from its head and no watcher notices.
	Relist bool
	// Err is what ended the watch.
	Err error
	// Quiet, for a silent watch, is how long it heard nothing: the
	// connections to etcd as quiet are closed before the next watch.
	Quiet time.Duration
}

func (e End) Error() string { return fmt.Sprintf("%s: %v", e.Reason, e.Err) }
