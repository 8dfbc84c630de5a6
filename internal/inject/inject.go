// Package inject names the bugs a faultinject build puts in the watch
// cache and the server on purpose, so that the test harnesses can show
// that they catch each one. In every other build nothing is injected: On
// is constant false and the compiler drops what it guards.
package inject

// Fault is one injected bug.
type Fault string

// Env names the fault a faultinject build injects, in its environment.
const Env = "CACHED_APISERVER_TEST_FAULT"

// The faults injected where the bug would be. The watch-level faults
// (drop, duplicate, reorder, early-bookmark) wrap each watch instead:
// pkg/storage/cacher's fault_inject.go.
const (
	// DropLastOfRevision drops the last event of every revision of several
	// events, as the fan-out once lost them (issue 56).
	DropLastOfRevision Fault = "drop-last-of-revision"
	// FloorOnProgress moves an empty history's floor up to each progress
	// notification, as the history once did: a resourceVersion a client
	// was handed then gets 410 (issue 56).
	FloorOnProgress Fault = "floor-on-progress"
	// ListMissesRevisionEvent leaves out of a list at R one of the objects
	// written at R, when R wrote several.
	ListMissesRevisionEvent Fault = "list-misses-revision-event"
	// ReadyzWithoutCache leaves the storage-readiness hook and the
	// watch-cache-initialized check out, so that /readyz says ready before
	// the caches serve (issue 56).
	ReadyzWithoutCache Fault = "readyz-without-cache"

	// The bugs of issue 65, each where the cache's transitions once had it.

	// BackfillGivesUp ends a warm start's backfill for good on a transient
	// failure (etcd paused, its watch silent), as it once did: watches from
	// before the start then get 410 for history etcd still holds.
	BackfillGivesUp Fault = "backfill-gives-up"
	// BackfillKept keeps a backfill that a re-list abandoned as the one
	// watches wait for, after a cold list: they get 429 until the next
	// warm start.
	BackfillKept Fault = "backfill-kept"
	// FailedListCold makes the list after a failed one cold.
	FailedListCold Fault = "failed-list-cold"
	// ExactListUnlocked takes an exact list's base without the
	// dispatcher's lock: between the store's apply of a revision and the
	// log's append of it, the list holds the revision after its own.
	ExactListUnlocked Fault = "exact-list-unlocked"
	// ReplayKeepsRepeats has the backfill's replay keep a revision etcd
	// delivered twice, out of order in the log.
	ReplayKeepsRepeats Fault = "replay-keeps-repeats"
	// WatchWaitsCreated opens the etcd watch waiting for etcd to answer
	// that it was created, with no silence check meanwhile.
	WatchWaitsCreated Fault = "watch-waits-created"
	// BackfillIdleByHead judges the replay's watch idle by the cache's
	// head, not the replay's position: a stalled replay of an idle etcd
	// then never ends.
	BackfillIdleByHead Fault = "backfill-idle-by-head"
)

// Known are the faults On can inject.
var Known = []Fault{DropLastOfRevision, FloorOnProgress, ListMissesRevisionEvent, ReadyzWithoutCache,
	BackfillGivesUp, BackfillKept, FailedListCold, ExactListUnlocked, ReplayKeepsRepeats, WatchWaitsCreated, BackfillIdleByHead}
