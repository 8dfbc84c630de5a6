package watchcheck

import (
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/watch"
)

// The guarantees a watch stream keeps, checked against etcd's history as
// etcd's robustness tests check etcd's own watch, in Kubernetes' terms:
// events carry resourceVersions, not responses, and an object entering or
// leaving a selector is ADDED or DELETED.
//
//   - ordered: events come in etcd's order: by revision, and a revision's
//     events in the order etcd recorded them;
//   - unique: no event arrives twice;
//   - atomic: a revision's events arrive whole: a stream that went on past
//     a revision got every event of it it selects;
//   - bookmarkable: a bookmark at b comes only after every event up to b,
//     and bookmarks never go back;
//   - reliable: every change etcd recorded that the selector sees arrives,
//     and nothing etcd did not record;
//   - resumable: a watch from r begins with the first change after r.
//
// A stream that ended inside a revision is not atomic at its end, and a
// client cannot resume inside a revision: that is Kubernetes'
// resourceVersion semantics, which cannot name a place inside one. Such a
// split is counted (Split), not a violation, unless the client cut the
// stream itself.

// Item is what a watch delivered: an event, or a bookmark (Key empty).
type Item struct {
	Type watch.EventType
	Key  string
	Rev  int64
}

// Segment is one watch's stream from the resourceVersion it started after.
type Segment struct {
	// From is the resourceVersion the watch started after: a list's, a
	// watch-list's initial-events-end, or the last one its client held.
	From  int64
	Items []Item
	// Cut says that the client stopped reading, not the server: where it
	// stopped tells nothing of the server.
	Cut bool
}

// Violations counts broken guarantees by guarantee. Details holds the
// first few, for a test's log.
type Violations struct {
	Ordered, Unique, Atomic, Bookmarkable, Reliable, Resumable int
	// Lists counts lists that differ from etcd's state at their
	// resourceVersion, Consistent consistent lists older than a write
	// acknowledged before they began, and Readiness readiness reported
	// before the server served.
	Lists, Consistent, Readiness int
	// Liveness counts what the server did not do in time once its faults
	// were over: a watch from a resourceVersion it handed out neither
	// served nor answered 410 below its floor, a 429 for longer than its
	// freshness timeout and 5 s, a list that did not answer, readiness not
	// back, or a floor above the one the same run reaches without faults.
	Liveness int
	// Split counts streams that ended inside a revision: not a violation.
	Split   int
	Details []string
}

// maxDetails bounds Details.
const maxDetails = 20

// Note counts one violation in counter and keeps its detail.
func (v *Violations) Note(counter *int, format string, args ...any) {
	*counter++
	if len(v.Details) < maxDetails {
		v.Details = append(v.Details, fmt.Sprintf(format, args...))
	}
}

// Add adds o's counts and details to v.
func (v *Violations) Add(o Violations) {
	v.Ordered += o.Ordered
	v.Unique += o.Unique
	v.Atomic += o.Atomic
	v.Bookmarkable += o.Bookmarkable
	v.Reliable += o.Reliable
	v.Resumable += o.Resumable
	v.Lists += o.Lists
	v.Consistent += o.Consistent
	v.Readiness += o.Readiness
	v.Liveness += o.Liveness
	v.Split += o.Split
	for _, d := range o.Details {
		if len(v.Details) < maxDetails {
			v.Details = append(v.Details, d)
		}
	}
}

// Total is the number of violations, splits aside.
func (v Violations) Total() int {
	return v.Ordered + v.Unique + v.Atomic + v.Bookmarkable + v.Reliable + v.Resumable + v.Lists + v.Consistent + v.Readiness +
		v.Liveness
}

func (v Violations) String() string {
	return fmt.Sprintf("ordered %d, unique %d, atomic %d, bookmarkable %d, reliable %d, resumable %d, lists %d, consistent %d, readiness %d, liveness %d (split at an end: %d)",
		v.Ordered, v.Unique, v.Atomic, v.Bookmarkable, v.Reliable, v.Resumable, v.Lists, v.Consistent, v.Readiness, v.Liveness, v.Split)
}

// Expected returns, in etcd's order, the events a watcher selecting what
// match accepts must receive for the changes in (from, to].
func Expected[O any](changes []Change[O], match func(*O) bool, from, to int64) []Item {
	var out []Item
	for _, c := range changes {
		if c.Rev <= from {
			continue
		}
		if c.Rev > to {
			break
		}
		was, is := c.Prev != nil && match(c.Prev), c.Cur != nil && match(c.Cur)
		switch {
		case was && is:
			out = append(out, Item{watch.Modified, c.Key, c.Rev})
		case is:
			out = append(out, Item{watch.Added, c.Key, c.Rev})
		case was:
			out = append(out, Item{watch.Deleted, c.Key, c.Rev})
		}
	}
	return out
}

// CheckSegment checks one watch's stream against etcd's changes. It covers
// the changes up to the newest event the stream delivered. name names the
// stream in the details.
func CheckSegment[O any](name string, changes []Change[O], match func(*O) bool, seg Segment) Violations {
	var v Violations
	to := seg.From
	for _, it := range seg.Items {
		if it.Type != watch.Bookmark {
			to = max(to, it.Rev)
		}
	}
	want := Expected(changes, match, seg.From, to)
	at := make(map[Item]int, len(want))
	for i, e := range want {
		at[e] = i
	}
	got := make(map[Item]bool, len(want))
	// next is the index in want after the furthest event received.
	next, lastRev, lastBookmark := 0, seg.From, int64(0)
	first := true
	for i, it := range seg.Items {
		if it.Type == watch.Bookmark {
			if it.Rev < lastBookmark || it.Rev < lastRev {
				v.Note(&v.Bookmarkable, "%s: bookmark at %d after resourceVersion %d", name, it.Rev, max(lastBookmark, lastRev))
			}
			for _, e := range want {
				if e.Rev > it.Rev {
					break
				}
				if !got[e] {
					v.Note(&v.Bookmarkable, "%s: bookmark at %d (item %d) before %s %s at %d", name, it.Rev, i, e.Type, e.Key, e.Rev)
					break
				}
			}
			lastBookmark = max(lastBookmark, it.Rev)
			continue
		}
		if first {
			first = false
			if len(want) > 0 && it != want[0] {
				v.Note(&v.Resumable, "%s: from %d began with %s %s at %d, want %s %s at %d", name, seg.From, it.Type, it.Key, it.Rev,
					want[0].Type, want[0].Key, want[0].Rev)
			}
		}
		idx, expected := at[it]
		switch {
		case got[it]:
			v.Note(&v.Unique, "%s: %s %s at %d arrived twice", name, it.Type, it.Key, it.Rev)
		case !expected:
			v.Note(&v.Reliable, "%s: %s %s at %d, which etcd's history does not imply", name, it.Type, it.Key, it.Rev)
		case idx < next || it.Rev < lastRev:
			v.Note(&v.Ordered, "%s: %s %s at %d after the event at %d", name, it.Type, it.Key, it.Rev, lastRev)
		}
		if expected && !got[it] {
			next = max(next, idx+1)
		}
		if it.Rev < lastBookmark {
			v.Note(&v.Bookmarkable, "%s: %s %s at %d after a bookmark at %d", name, it.Type, it.Key, it.Rev, lastBookmark)
		}
		lastRev = max(lastRev, it.Rev)
		got[it] = true
	}
	// What did not arrive: a revision it got part of is not atomic, but
	// for the last one, where the stream may have ended; anything else was
	// dropped.
	partial := map[int64]int{}
	wanted := map[int64]int{}
	for _, e := range want {
		wanted[e.Rev]++
		if got[e] {
			partial[e.Rev]++
		}
	}
	split := false
	for _, e := range want {
		switch {
		case got[e]:
		case e.Rev == to && partial[e.Rev] > 0:
			split = true
		case partial[e.Rev] > 0:
			v.Note(&v.Atomic, "%s: revision %d without %s %s: %d of its %d events arrived, and the stream went on to %d",
				name, e.Rev, e.Type, e.Key, partial[e.Rev], wanted[e.Rev], to)
		default:
			v.Note(&v.Reliable, "%s: missed %s %s at %d (from %d)", name, e.Type, e.Key, e.Rev, seg.From)
		}
	}
	if split && !seg.Cut {
		v.Split++
	}
	return v
}

// List is one list a client was given.
type List struct {
	// Who names the client in the details.
	Who string
	// Rev is the list's resourceVersion, and Items its objects' keys and
	// resourceVersions.
	Rev   int64
	Items map[string]int64
	// MinRev, for a consistent list, is the newest write acknowledged
	// before it began; 0 for a list that may be stale.
	MinRev int64
}

// CheckList checks a list against etcd's state at its resourceVersion,
// for the objects match selects.
func CheckList[O any](h *History[O], match func(*O) bool, l List) Violations {
	var v Violations
	if l.Rev < l.MinRev {
		v.Note(&v.Consistent, "%s: consistent list at %d, older than a write acknowledged at %d before it", l.Who, l.Rev, l.MinRev)
	}
	if l.Rev < h.Start {
		v.Note(&v.Lists, "%s: list at %d, before the history began at %d: cannot be checked", l.Who, l.Rev, h.Start)
		return v
	}
	want := map[string]int64{}
	for k, ver := range h.StateAt(l.Rev) {
		if match(ver.Obj) {
			want[k] = ver.Rev
		}
	}
	if d, keys := Diff(want, l.Items); d != "" {
		var hist []string
		for _, k := range keys {
			hist = append(hist, h.Describe(k))
		}
		v.Note(&v.Lists, "%s: list at %d differs from etcd: %s; in etcd, %v", l.Who, l.Rev, d, hist)
	}
	return v
}

// Diff describes the first differences between two key → resourceVersion
// maps, and names their keys; "" if they are equal.
func Diff(want, got map[string]int64) (string, []string) {
	type diff struct{ key, text string }
	var diffs []diff
	for k, rv := range want {
		if g, ok := got[k]; !ok {
			diffs = append(diffs, diff{k, fmt.Sprintf("missing %s@%d", k, rv)})
		} else if g != rv {
			diffs = append(diffs, diff{k, fmt.Sprintf("%s@%d, want @%d", k, g, rv)})
		}
	}
	for k, rv := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, diff{k, fmt.Sprintf("extra %s@%d", k, rv)})
		}
	}
	if len(diffs) == 0 {
		return "", nil
	}
	sort.Slice(diffs, func(i, j int) bool { return diffs[i].text < diffs[j].text })
	more := len(diffs) - 3
	diffs = diffs[:min(len(diffs), 3)]
	var texts, keys []string
	for _, d := range diffs {
		texts, keys = append(texts, d.text), append(keys, d.key)
	}
	if more > 0 {
		texts = append(texts, fmt.Sprintf("and %d more", more))
	}
	return fmt.Sprint(texts), keys
}
