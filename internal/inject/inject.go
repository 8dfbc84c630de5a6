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
	// ReadyzWithoutCache leaves the storage-readiness hook out, so that
	// /readyz says ready before the caches serve (issue 56).
	ReadyzWithoutCache Fault = "readyz-without-cache"
)

// Known are the faults On can inject.
var Known = []Fault{DropLastOfRevision, FloorOnProgress, ListMissesRevisionEvent, ReadyzWithoutCache}
