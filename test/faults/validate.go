package faults

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/watch"
)

// The invariants every stream must keep, after etcd's robustness tests
// (tests/robustness/validate/watch.go), checked against the truth rather
// than against expectations written by hand:
//
//   - ordered: resourceVersions strictly increase;
//   - unique: no event arrives twice;
//   - reliable: every change in etcd that touches the selector arrives, an
//     object entering it as ADDED and leaving it as DELETED, with nothing
//     that etcd did not record;
//   - resumable: a watch resumed from r goes on with the first change after
//     r (a skip shows as a missed event), or ends with a 410;
//   - bookmarkable: a bookmark at b arrives only after every change up to
//     b, and bookmarks never go back.
//
// Every list must equal the truth at its resourceVersion, and a consistent
// list must be at least as fresh as every write acknowledged before it.

// violations counts broken invariants. Details holds the first few, for
// the test's log.
type violations struct {
	missed, duplicated, outOfOrder, unexpected, bookmarks, lists int
	details                                                      []string
}

func (v *violations) note(counter *int, format string, args ...any) {
	*counter++
	if len(v.details) < 20 {
		v.details = append(v.details, fmt.Sprintf(format, args...))
	}
}

func (v *violations) add(o violations) {
	v.missed += o.missed
	v.duplicated += o.duplicated
	v.outOfOrder += o.outOfOrder
	v.unexpected += o.unexpected
	v.bookmarks += o.bookmarks
	v.lists += o.lists
	for _, d := range o.details {
		if len(v.details) < 20 {
			v.details = append(v.details, d)
		}
	}
}

func (v violations) total() int {
	return v.missed + v.duplicated + v.outOfOrder + v.unexpected + v.bookmarks + v.lists
}

// expectedEvent is a change a watcher with some selector must receive.
type expectedEvent struct {
	typ watch.EventType
	key string
	rv  int64
}

// expected returns, in order, the events a watcher of m must receive for
// the changes in (from, to].
func expected(history []truthEvent, m matcher, from, to int64) []expectedEvent {
	var out []expectedEvent
	for _, e := range history {
		if e.rv <= from {
			continue
		}
		if e.rv > to {
			break
		}
		was, is := m.matches(e.prev), m.matches(e.cur)
		switch {
		case was && is:
			out = append(out, expectedEvent{watch.Modified, e.key, e.rv})
		case is:
			out = append(out, expectedEvent{watch.Added, e.key, e.rv})
		case was:
			out = append(out, expectedEvent{watch.Deleted, e.key, e.rv})
		}
	}
	return out
}

// validateSegment checks one segment of a stream against the truth. It
// covers the changes up to the newest resourceVersion the segment reached.
func validateSegment(name string, history []truthEvent, m matcher, seg *segment) violations {
	var v violations
	if seg.initial != nil {
		return v // a watch-list that never completed its state: nothing to check
	}
	to := seg.from
	for _, r := range seg.events {
		to = max(to, r.rv)
	}
	want := expected(history, m, seg.from, to)
	wantByID := map[expectedEvent]bool{}
	for _, e := range want {
		wantByID[e] = true
	}
	got := map[expectedEvent]bool{}
	lastEvent, lastBookmark := seg.from, int64(0)
	for i, r := range seg.events {
		if r.typ == watch.Bookmark {
			if r.rv < lastBookmark || r.rv < lastEvent {
				v.note(&v.bookmarks, "%s: bookmark at %d after resourceVersion %d", name, r.rv, max(lastBookmark, lastEvent))
			}
			// Every change up to the bookmark must have arrived before it.
			for _, e := range want {
				if e.rv > r.rv {
					break
				}
				if !got[e] {
					v.note(&v.bookmarks, "%s: bookmark at %d (event %d) before %s %s at %d", name, r.rv, i, e.typ, e.key, e.rv)
					break
				}
			}
			lastBookmark = r.rv
			continue
		}
		id := expectedEvent{r.typ, r.key, r.rv}
		switch {
		case got[id]:
			v.note(&v.duplicated, "%s: %s %s at %d arrived twice", name, r.typ, r.key, r.rv)
		case !wantByID[id]:
			v.note(&v.unexpected, "%s: %s %s at %d, which etcd's history does not imply for %s", name, r.typ, r.key, r.rv, m.sel)
		}
		if r.rv <= lastEvent {
			v.note(&v.outOfOrder, "%s: %s %s at %d after resourceVersion %d", name, r.typ, r.key, r.rv, lastEvent)
		}
		lastEvent = max(lastEvent, r.rv)
		got[id] = true
	}
	for _, e := range want {
		if !got[e] {
			v.note(&v.missed, "%s: missed %s %s at %d (segment from %d)", name, e.typ, e.key, e.rv, seg.from)
		}
	}
	return v
}

// validateList checks a list against the truth at its resourceVersion.
func validateList(t *truth, l listResult) violations {
	var v violations
	m, err := newMatcher(l.sel)
	if err != nil {
		v.note(&v.lists, "%s: %v", l.who, err)
		return v
	}
	if l.consistent && l.rv < l.minRV {
		v.note(&v.lists, "%s: consistent list at %d, older than a write acknowledged at %d before it", l.who, l.rv, l.minRV)
	}
	if l.rv < t.start {
		// The truth begins at its start: it cannot tell a state before it.
		// It starts before the scenario's first write, so only a list
		// served before any of them lands here.
		v.note(&v.lists, "%s: list at %d, before the truth began at %d: cannot be checked", l.who, l.rv, t.start)
		return v
	}
	want := map[string]int64{}
	for k, o := range t.stateAt(l.rv) {
		if m.matches(o) {
			want[k] = o.rv
		}
	}
	if d, keys := itemDiffs(want, l.items); d != "" {
		v.note(&v.lists, "%s: list at %d differs from etcd: %s; in etcd, %s", l.who, l.rv, d, t.keyHistory(keys))
	}
	return v
}

// keyHistory describes what the truth holds of keys: each one's state when
// it began and its changes since, for a violation's reader.
func (t *truth) keyHistory(keys []string) string {
	events, _ := t.history()
	var out []string
	for _, k := range keys {
		h := "absent"
		if o, ok := t.initial[k]; ok {
			h = fmt.Sprintf("@%d", o.rv)
		}
		h = fmt.Sprintf("%s: %s at %d", k, h, t.start)
		for _, e := range events {
			switch {
			case e.key != k:
			case e.cur == nil:
				h += fmt.Sprintf(", deleted at %d", e.rv)
			default:
				h += fmt.Sprintf(", written at %d", e.rv)
			}
		}
		out = append(out, h)
	}
	return strings.Join(out, "; ")
}

// diffItems describes the first differences between two key → resourceVersion maps.
func diffItems(want, got map[string]int64) string {
	d, _ := itemDiffs(want, got)
	return d
}

// itemDiffs is diffItems, and the keys it names.
func itemDiffs(want, got map[string]int64) (string, []string) {
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
