package inject

import "time"

// Point names a failpoint: a step of one of the cache's transitions where a
// faultinject build can sleep, fail, or end the etcd watch, so that the
// randomized robustness runs can put a fault inside the transition. In
// every other build Hit does nothing and is inlined away: the server users
// run holds no failpoint (TestServerHoldsNoFailpoint).
type Point string

// The failpoints, by transition.
const (
	// ListPageBefore and ListPageAfter are before and after each page of
	// the source's lists from etcd: the first list, a re-list, and the
	// backfill's list at its start.
	ListPageBefore Point = "list-page-before"
	ListPageAfter  Point = "list-page-after"
	// ListToWatch is between a list and the watch that follows from it.
	ListToWatch Point = "list-to-watch"
	// Relist is before a re-list, once the cache knows it must list again.
	Relist Point = "relist"
	// Replay is inside the backfill's replay of etcd's history, at each
	// response of its etcd watch, as WatchResponse is for the follower's.
	Replay Point = "replay"
	// BackfillPrepend is before the log accepts the backfill's events.
	BackfillPrepend Point = "backfill-prepend"
	// ApplyAppend is between the store's apply of a revision and the log's
	// append of it, with the dispatcher's lock held: its sleeps are capped
	// (MaxSleep), since every reader waits on that lock.
	ApplyAppend Point = "apply-append"
	// ConsistencyCheck is before the consistency check reads etcd.
	ConsistencyCheck Point = "consistency-compare"
	// SilenceCheck is at each tick of the silence check of an etcd watch.
	SilenceCheck Point = "silence-check"
	// WatchResponse is at each response of the etcd watch that follows
	// etcd: ErrRepeat delivers the response twice, as etcd's
	// client can after resuming on a lagging member (etcd-io/etcd#20221);
	// ErrStall drops it and every one after it.
	WatchResponse Point = "follower-response"
	// OutageEnd is when an outage ends: a new etcd watch delivered its
	// first response.
	OutageEnd Point = "outage-end"
	// WatchOpen is where an etcd watch is opened: ErrStall holds it there
	// until the watch is closed, as a member that takes the stream and
	// never answers does, whether or not the failpoint is disarmed since.
	WatchOpen Point = "watch-open"
)

// FailpointsEnvName is the environment variable that arms failpoints in
// a faultinject build (FailpointsEnv there).
const FailpointsEnvName = "CACHED_APISERVER_FAILPOINTS"

// Points are every failpoint.
var Points = []Point{ListPageBefore, ListPageAfter, ListToWatch, Relist, Replay, BackfillPrepend, ApplyAppend,
	ConsistencyCheck, SilenceCheck, WatchResponse, OutageEnd, WatchOpen}

// Error is what a failpoint returns when it fires, besides sleeping. Its
// values are constants, so that a build without failpoints holds none.
type Error string

func (e Error) Error() string { return string(e) }

// What a failpoint does when it fires, besides sleeping.
const (
	// ErrFailpoint is the error a failpoint returns: the step failed, as
	// when etcd does not answer.
	ErrFailpoint Error = "failpoint: injected failure"
	// ErrEndWatch ends the etcd watch the step belongs to, as when etcd
	// closes the stream.
	ErrEndWatch Error = "failpoint: the etcd watch ended"
	// ErrRepeat has the step deliver what it delivers twice.
	ErrRepeat Error = "failpoint: delivered again"
	// ErrStall has the etcd watch deliver nothing more, from this
	// response on, or never open: its member went silent.
	ErrStall Error = "failpoint: the etcd watch stalled"
	// ErrMismatch has the consistency check find the cache differing from
	// etcd, so that the cache re-lists cold, as after a real difference:
	// the one way a randomized run makes a cold re-list.
	ErrMismatch Error = "failpoint: the cache differs from etcd"
)

// Kind is what an armed failpoint does.
type Kind string

// The kinds of action.
const (
	Sleep    Kind = "sleep"
	Fail     Kind = "error"
	EndWatch Kind = "end-watch"
	Repeat   Kind = "repeat"
	Stall    Kind = "stall"
	Mismatch Kind = "mismatch"
)

// Action is what an armed failpoint does when hit.
type Action struct {
	Kind Kind
	// Sleep is how long a Sleep action sleeps, unless its context ends.
	Sleep time.Duration
	// Prob is the chance that a hit fires, in (0, 1]; 0 is 1.
	Prob float64
	// Count bounds how many hits fire; 0 is no bound.
	Count int
}

// MaxSleep bounds the sleeps at points where the dispatcher's lock is held.
const MaxSleep = 50 * time.Millisecond
