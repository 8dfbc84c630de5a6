package faults

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// result is one scenario run against one server.
type result struct {
	scenario, server string
	// seed is the run's: the same seed draws the same traffic.
	seed uint64
	watchcheck.Violations
	// Streams ended, by how. Probes from old resourceVersions are counted
	// apart: their 410s are what compaction promises. So are the 410s of
	// streams that resumed from before one of etcd's compactions.
	ended410, endedError, endedClosed, compacted410 int
	// timedOut counts watches the server ended at their timeout (30–60
	// minutes without timeoutSeconds): not a fault's doing, and not
	// counted as ended.
	timedOut int
	// closedEmpty counts connections of streams that asked for bookmarks
	// which the server closed having delivered nothing.
	closedEmpty       int
	probes, probes410 int
	// relists counts client re-lists: streams' and informers'.
	relists int
	// cacheRelists is how often the server's own cache for assignments
	// re-listed etcd (its watch cache initializations after the first).
	cacheRelists int
	// cacheRewatches is how often our cache re-opened its etcd watch
	// without re-listing: the proof that the fault reached it. Upstream's
	// reflector re-watches too, but counts it nowhere.
	cacheRewatches int
	// recovery is from the fault's heal until every open stream had received a
	// write made after it; sentinelLatency is the slowest sentinel's
	// delivery after its write was acknowledged.
	recovery, sentinelLatency time.Duration
	// undelivered counts sentinels some stream never received.
	undelivered int
	// unready is whether /readyz failed while the fault was on;
	// readyAgain is when, after the heal, it answered 200 again.
	unready    bool
	readyAgain time.Duration
	// writesStalled is whether writes failed to resume within resumeBound.
	writesStalled bool
	// harnessErrors are what the harness could not measure: the scenario
	// fails, whichever server it ran.
	harnessErrors []string
	// checksFailed counts failed consistency checks of our cache.
	checksFailed int
	// staleReadErrors counts failed lists at resourceVersion 0, which a
	// cache should answer whatever etcd's state.
	staleReadErrors int
	// unclearErrors counts failed consistent lists whose code was not 429,
	// 503 or 504 (or 410 for a compacted continue token): a client cannot
	// tell when to retry them.
	unclearErrors int
	// storm is what the reconnect storm measured; nil in other scenarios.
	storm *stormResult
	// silent is what the member-gone-silent scenario measured; nil in others.
	silent *silentResult
	// soak is what the soak measured; nil in the scenarios.
	soak *soakResult
	// compactedUnder: a fault compacted etcd past what every client
	// held, and clients re-list for etcd's compaction (env.compactedUnder).
	compactedUnder bool
	writesOK       int
	writesFailed   int
	listErrors     int
	notes          []string
	// load is what a run under load measured beside the rest; nil in
	// the scenarios without it.
	load *loadResult
}

func (r *result) notef(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// writeTable prints results as a Markdown table, one row per scenario and
// server. Repeated runs (go test -count) share a row: counts are summed,
// times are the median with the range.
func writeTable(w io.Writer, results []*result) {
	fmt.Fprintln(w, "| scenario | server | runs | ordered | unique | atomic | bookmarkable | reliable | resumable | lists | readiness | liveness | ended 410 | ended error | ended closed | client re-lists | cache re-lists | cache re-watches | recovery | sentinel p100 | /readyz unready | writes ok/failed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	type key struct{ scenario, server string }
	var order []key
	groups := map[key][]*result{}
	for _, r := range results {
		k := key{r.scenario, r.server}
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].scenario < order[j].scenario })
	for _, k := range order {
		g := groups[k]
		var sum result
		var recovery, sentinel []time.Duration
		unready := 0
		for _, r := range g {
			sum.Add(r.Violations)
			sum.ended410 += r.ended410
			sum.compacted410 += r.compacted410
			sum.endedError += r.endedError
			sum.endedClosed += r.endedClosed
			sum.probes += r.probes
			sum.probes410 += r.probes410
			sum.relists += r.relists
			sum.cacheRelists += r.cacheRelists
			sum.cacheRewatches += r.cacheRewatches
			sum.writesOK += r.writesOK
			sum.writesFailed += r.writesFailed
			recovery = append(recovery, r.recovery)
			sentinel = append(sentinel, r.sentinelLatency)
			if r.unready {
				unready++
			}
		}
		ended410 := fmt.Sprint(sum.ended410)
		if sum.compacted410 > 0 {
			ended410 += fmt.Sprintf(" (+%d compacted)", sum.compacted410)
		}
		if sum.probes > 0 {
			ended410 += fmt.Sprintf(" (+%d/%d probes)", sum.probes410, sum.probes)
		}
		rewatches := "-"
		if strings.HasPrefix(k.server, ours) {
			rewatches = fmt.Sprint(sum.cacheRewatches)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s | %d | %d | %d | %d | %s | %s | %s | %d/%d | %d/%d |\n",
			k.scenario, k.server, len(g), sum.Ordered, sum.Unique, sum.Atomic, sum.Bookmarkable, sum.Reliable, sum.Resumable,
			sum.Lists+sum.Consistent, sum.Readiness, sum.Liveness, ended410, sum.endedError,
			sum.endedClosed, sum.relists, sum.cacheRelists, rewatches, spread(recovery), spread(sentinel),
			unready, len(g), sum.writesOK, sum.writesFailed)
	}
}

// spread is the median of ds, with the range when there are several.
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	median := round(s[len(s)/2])
	if len(s) == 1 {
		return median
	}
	return fmt.Sprintf("%s (%s–%s)", median, round(s[0]), round(s[len(s)-1]))
}

func round(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// summary is a one-line account of a result for the test log.
func (r *result) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s (seed %d): %v ended(410/compacted 410/err/closed)=%d/%d/%d/%d relists=%d cacheRelists=%d rewatches=%d recovery=%v sentinel=%v undelivered=%d checksFailed=%d writes=%d/%d",
		r.scenario, r.server, r.seed, r.Violations, r.ended410, r.compacted410, r.endedError, r.endedClosed, r.relists, r.cacheRelists,
		r.cacheRewatches, round(r.recovery), round(r.sentinelLatency), r.undelivered, r.checksFailed, r.writesOK, r.writesFailed)
	fmt.Fprintf(&b, " readyAgain=%v timedOut=%d", round(r.readyAgain), r.timedOut)
	for _, n := range r.notes {
		b.WriteString("\n  note: " + n)
	}
	for _, h := range r.harnessErrors {
		b.WriteString("\n  harness error: " + h)
	}
	for _, d := range r.Details {
		b.WriteString("\n  violation: " + d)
	}
	return b.String()
}
