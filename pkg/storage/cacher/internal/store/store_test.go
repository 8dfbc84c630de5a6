package store

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// event is a test event.
type event struct {
	typ       watch.EventType
	rv        uint64
	cur, prev *object.Object
}

func (e *event) RV() uint64 { return e.rv }
func (e *event) Change() (watch.EventType, *object.Object, *object.Object) {
	return e.typ, e.cur, e.prev
}

// history is the events applied, as the cache's event log holds them.
type history []*event

// between returns the events in (rv, upTo]; false when rv is before the
// history's first.
func (h history) between(rv, upTo uint64) ([]*event, bool) {
	if len(h) > 0 && rv < h[0].rv-1 {
		return nil, false
	}
	var out []*event
	for _, e := range h {
		if e.rv > rv && e.rv <= upTo {
			out = append(out, e)
		}
	}
	return out, true
}

func obj(key string, rv uint64) *object.Object { return &object.Object{Key: key, RV: rv} }

// keys returns the objects' keys, in their order.
func keys(objs []*object.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Key)
	}
	return out
}

// contents returns key → resourceVersion of every object in sn.
func contents(sn Snapshot) map[string]uint64 {
	got := map[string]uint64{}
	sn.Scan("", true, "", func(o *object.Object) bool { got[o.Key] = o.RV; return true })
	return got
}

// TestAt applies adds, updates and deletes with snapshots taken only now
// and then, as lists take them, and checks that the state at every
// resourceVersion in the history is rebuilt exactly, from a snapshot or
// from the current state, by undoing the events after it.
func TestAt(t *testing.T) {
	s := New[*event](nil)
	s.Replace([]*object.Object{{Key: "/a", RV: 1}, {Key: "/b", RV: 1}}, 1)
	var h history

	// want[rv] is key → object rv at rv.
	state := map[string]uint64{"/a": 1, "/b": 1}
	want := map[uint64]map[string]uint64{1: maps.Clone(state)}
	steps := []struct {
		typ      watch.EventType
		key      string
		snapshot bool // a list takes the current state after this step
	}{
		{watch.Added, "/c", false},
		{watch.Modified, "/a", true},
		{watch.Deleted, "/b", false},
		{watch.Modified, "/c", false},
		{watch.Added, "/b", true},
		{watch.Deleted, "/a", false},
		{watch.Modified, "/b", false},
	}
	current := map[string]*object.Object{"/a": {Key: "/a", RV: 1}, "/b": {Key: "/b", RV: 1}}
	for i, st := range steps {
		rv := uint64(i + 2)
		e := &event{typ: st.typ, rv: rv, prev: current[st.key], cur: &object.Object{Key: st.key, RV: rv}}
		if st.typ == watch.Deleted {
			delete(current, st.key)
			delete(state, st.key)
		} else {
			current[st.key] = e.cur
			state[st.key] = rv
		}
		s.Apply(e)
		h = append(h, e)
		if st.snapshot {
			s.Latest()
		}
		want[rv] = maps.Clone(state)
	}
	if snapshots := s.Counts().Snapshots; snapshots != 3 {
		t.Errorf("%d snapshots, want 3: the list's, and two taken by lists", snapshots)
	}
	for rv := uint64(1); rv <= uint64(len(steps)+1); rv++ {
		t.Run(fmt.Sprint("rv=", rv), func(t *testing.T) {
			sn, ok := s.At(rv, h.between)
			if !ok {
				t.Fatal("not available")
			}
			if got := contents(sn); !maps.Equal(got, want[rv]) || sn.RV != rv {
				t.Errorf("At(%d) = %v at %d, want %v", rv, got, sn.RV, want[rv])
			}
		})
	}
	if _, ok := s.At(uint64(len(steps)+2), h.between); ok {
		t.Error("a future resourceVersion must not be available")
	}
	h = h[2:] // the history now starts after 3
	s.Prune(3)
	if _, ok := s.At(2, h.between); ok {
		t.Error("a resourceVersion whose events left the history must not be available")
	}
	if _, ok := s.At(3, h.between); !ok {
		t.Error("the history's start must still be available")
	}
	// The list's snapshot at 1 goes; the lists' at 3 and 6 stay, and so
	// does the one At took of the current state at 8.
	if snapshots := s.Counts().Snapshots; snapshots != 3 {
		t.Errorf("%d snapshots after pruning to 3, want 3", snapshots)
	}
}

// TestSnapshotIsImmutable checks that a snapshot taken before writes still
// holds the state it was taken at.
func TestSnapshotIsImmutable(t *testing.T) {
	s := New[*event](nil)
	a1 := obj("/a", 1)
	s.Replace([]*object.Object{a1}, 1)
	sn := s.Latest()
	s.Apply(&event{typ: watch.Modified, rv: 2, cur: obj("/a", 2), prev: a1})
	s.Apply(&event{typ: watch.Added, rv: 3, cur: obj("/b", 3)})
	if got, want := contents(sn), map[string]uint64{"/a": 1}; !maps.Equal(got, want) || sn.RV != 1 {
		t.Errorf("the snapshot at 1 holds %v at %d after writes, want %v", got, sn.RV, want)
	}
	if got, want := contents(s.Latest()), map[string]uint64{"/a": 2, "/b": 3}; !maps.Equal(got, want) {
		t.Errorf("the latest state is %v, want %v", got, want)
	}
	s.Advance(7)
	if rv := s.Latest().RV; rv != 7 {
		t.Errorf("after a progress notification at 7 the state is at %d", rv)
	}
	s.Advance(5)
	if rv := s.Latest().RV; rv != 7 {
		t.Errorf("an older progress notification moved the state back to %d", rv)
	}
}

func TestScan(t *testing.T) {
	s := New[*event](nil)
	var objs []*object.Object
	for _, k := range []string{"/a/x", "/a/y", "/a/z", "/ab", "/b/x"} {
		objs = append(objs, obj(k, 1))
	}
	s.Replace(objs, 1)
	sn := s.Latest()
	for _, tc := range []struct {
		name      string
		prefix    string
		recursive bool
		from      string
		stopAfter int
		want      []string
	}{
		{name: "everything", recursive: true, want: []string{"/a/x", "/a/y", "/a/z", "/ab", "/b/x"}},
		{name: "prefix", prefix: "/a/", recursive: true, want: []string{"/a/x", "/a/y", "/a/z"}},
		{name: "from a key", prefix: "/a/", recursive: true, from: "/a/y\x00", want: []string{"/a/z"}},
		{name: "from before the prefix", prefix: "/b/", recursive: true, from: "/a", want: []string{"/b/x"}},
		{name: "stopped", prefix: "/a/", recursive: true, stopAfter: 2, want: []string{"/a/x", "/a/y"}},
		{name: "one key", prefix: "/a/y", want: []string{"/a/y"}},
		{name: "one key past from", prefix: "/a/y", from: "/a/y\x00"},
		{name: "missing key", prefix: "/a/w"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			sn.Scan(tc.prefix, tc.recursive, tc.from, func(o *object.Object) bool {
				got = append(got, o.Key)
				return tc.stopAfter == 0 || len(got) < tc.stopAfter
			})
			if !slices.Equal(got, tc.want) {
				t.Errorf("Scan = %q, want %q", got, tc.want)
			}
		})
	}
	if sn.Len() != 5 {
		t.Errorf("Len = %d, want 5", sn.Len())
	}
}

// TestCount checks that Count counts what Scan visits, at the edges of a
// prefix's range: the key just past it, a last byte above 0x7e, keys of
// 0xff bytes, and no prefix.
func TestCount(t *testing.T) {
	s := New[*event](nil)
	var objs []*object.Object
	for _, k := range []string{"/a/x", "/a/y", "/a/z", "/a0", "/ab", "/a\xff", "/a\xff\xff", "/b/x", "/\x7f/x", "/\x80", "\xff", "\xff\xff"} {
		objs = append(objs, obj(k, 1))
	}
	s.Replace(objs, 1)
	sn := s.Latest()
	for _, tc := range []struct {
		prefix, from string
		want         int
	}{
		{prefix: "", want: 12},
		{prefix: "/a/", want: 3},
		{prefix: "/a/", from: "/a/y", want: 2},
		{prefix: "/a/", from: "/a/z\x00", want: 0},
		{prefix: "/a/", from: "/0", want: 3},
		{prefix: "/a", want: 7},
		{prefix: "/a\xff", want: 2},
		{prefix: "/a\xff", from: "/a\xff\x00", want: 1},
		{prefix: "/\x7f", want: 1},
		{prefix: "\xff", want: 2},
		{prefix: "\xff\xff", want: 1},
		{prefix: "/c/", want: 0},
	} {
		t.Run(fmt.Sprintf("%q from %q", tc.prefix, tc.from), func(t *testing.T) {
			scanned := 0
			sn.Scan(tc.prefix, true, tc.from, func(*object.Object) bool { scanned++; return true })
			if got := sn.Count(tc.prefix, tc.from); got != tc.want || got != scanned {
				t.Errorf("Count = %d, want %d (Scan visits %d)", got, tc.want, scanned)
			}
		})
	}
}

// TestByIndex checks that the indexes follow adds, updates that change a
// value, deletes, events whose previous object is a copy, and a replace.
func TestByIndex(t *testing.T) {
	byName := map[string]func(*object.Object) []string{"name": func(o *object.Object) []string { return []string{o.Name()} }}
	named := func(key, name string, rv uint64) *object.Object {
		o := &object.Object{Key: key, RV: rv}
		o.SetName(name)
		return o
	}
	s := New[*event](byName)
	a1, b1 := named("/a", "n1", 1), named("/b", "n1", 1)
	s.Replace([]*object.Object{b1, a1}, 1)
	a2 := named("/a", "n2", 2)
	s.Apply(&event{typ: watch.Modified, rv: 2, cur: a2, prev: a1})
	c3 := named("/c", "n2", 3)
	s.Apply(&event{typ: watch.Added, rv: 3, cur: c3})
	s.Apply(&event{typ: watch.Deleted, rv: 4, cur: b1, prev: b1})
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"n1", nil},
		{"n2", []string{"/a", "/c"}},
		{"n3", nil},
	} {
		objs, rv, ok := s.ByIndex("name", tc.value)
		got := keys(objs)
		if !ok || rv != 4 || !slices.Equal(got, tc.want) {
			t.Errorf("ByIndex(name, %s) = %q at %d (%v), want %q at 4", tc.value, got, rv, ok, tc.want)
		}
	}
	if _, _, ok := s.ByIndex("missing", "x"); ok {
		t.Error("an index the store does not have must say so")
	}
	// An event's previous object may be an equal copy of the one the store
	// holds: what the store held leaves the index all the same.
	s.Apply(&event{typ: watch.Modified, rv: 5, cur: named("/c", "n3", 5), prev: named("/c", "n2", 3)})
	s.Apply(&event{typ: watch.Deleted, rv: 6, cur: named("/a", "n2", 6), prev: named("/a", "n2", 2)})
	for value, want := range map[string][]string{"n2": nil, "n3": {"/c"}} {
		objs, _, _ := s.ByIndex("name", value)
		if got := keys(objs); !slices.Equal(got, want) {
			t.Errorf("after events with copies: ByIndex(name, %s) = %q, want %q", value, got, want)
		}
	}
	s.Replace([]*object.Object{named("/d", "n1", 9)}, 9)
	if objs, _, _ := s.ByIndex("name", "n2"); len(objs) != 0 {
		t.Errorf("a replace kept %d stale index entries", len(objs))
	}
	if o, ok := s.Get("/d"); !ok || o.RV != 9 {
		t.Errorf("Get(/d) after replace = %v, %v", o, ok)
	}
}

// TestIndexValuesHoldNoObject checks that an index keeps its values as
// strings of its own: a value may lie in an object's bytes or key
// (Object.Trigger, Object.Name), and an index that kept it would hold them
// for as long as any object has that value, after this one has gone.
func TestIndexValuesHoldNoObject(t *testing.T) {
	byName := map[string]func(*object.Object) []string{"name": func(o *object.Object) []string { return []string{o.Name()} }}
	s := New[*event](byName)
	var objs []*object.Object
	for _, key := range []string{"/a/n1", "/b/n1"} {
		o := &object.Object{Key: strings.Clone(key), RV: 1}
		o.SetName("n1")
		objs = append(objs, o)
	}
	s.Replace(objs, 1)
	s.Apply(&event{typ: watch.Deleted, rv: 2, cur: objs[0], prev: objs[0]})
	for value := range s.indexes["name"] {
		for _, o := range objs {
			start := uintptr(unsafe.Pointer(unsafe.StringData(o.Key)))
			if p := uintptr(unsafe.Pointer(unsafe.StringData(value))); p >= start && p < start+uintptr(len(o.Key)) {
				t.Errorf("the index value %q lies in the key of %s", value, o.Key)
			}
		}
	}
	if got, _, _ := s.ByIndex("name", "n1"); len(got) != 1 || got[0] != objs[1] {
		t.Errorf("ByIndex(name, n1) = %v, want /b/n1", got)
	}
}

// TestCounts checks that the objects' stored size follows a replace, adds,
// updates, deletes and an event for a key the store lacks.
func TestCounts(t *testing.T) {
	// sized is an object whose StoredSize is n: JSON (it has a type
	// header) whose bytes hold a resourceVersion field beside n others.
	sized := func(key string, rv uint64, n int) *object.Object {
		return &object.Object{Key: key, RV: rv, Head: 1, Raw: make([]byte, n+len(fmt.Sprintf(`"resourceVersion":"%d",`, rv)))}
	}
	a1, b1 := sized("/a", 1, 100), sized("/b", 1, 10)
	a2, c3 := sized("/a", 2, 1000), sized("/c", 3, 7)
	s := New[*event](nil)
	for _, tc := range []struct {
		name    string
		do      func()
		objects int
		stored  int64
	}{
		{name: "empty", do: func() {}},
		{name: "replace", do: func() { s.Replace([]*object.Object{a1, b1}, 1) }, objects: 2, stored: 110},
		{name: "update", do: func() { s.Apply(&event{typ: watch.Modified, rv: 2, cur: a2, prev: a1}) }, objects: 2, stored: 1010},
		{name: "add", do: func() { s.Apply(&event{typ: watch.Added, rv: 3, cur: c3}) }, objects: 3, stored: 1017},
		{name: "delete", do: func() { s.Apply(&event{typ: watch.Deleted, rv: 4, cur: b1, prev: b1}) }, objects: 2, stored: 1007},
		{name: "delete again", do: func() { s.Apply(&event{typ: watch.Deleted, rv: 5, cur: b1, prev: b1}) }, objects: 2, stored: 1007},
		{name: "added over a key held", do: func() { s.Apply(&event{typ: watch.Added, rv: 6, cur: a1}) }, objects: 2, stored: 107},
		{name: "replace again", do: func() { s.Replace([]*object.Object{c3}, 7) }, objects: 1, stored: 7},
	} {
		tc.do()
		if got := s.Counts(); got.Objects != tc.objects || got.Stored != tc.stored {
			t.Errorf("after %s: Counts = %+v, want %d objects of %d bytes", tc.name, got, tc.objects, tc.stored)
		}
	}
}
