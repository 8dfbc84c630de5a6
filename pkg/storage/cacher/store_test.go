package cacher

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// TestStoreAt applies adds, updates and deletes with snapshots taken only
// now and then, as lists take them, and checks that the state at every
// resourceVersion in the history is rebuilt exactly, from a snapshot or
// from the current state, by undoing the events after it.
func TestStoreAt(t *testing.T) {
	s := newStore(map[string]func(*object.Object) []string{})
	l := newTestLog(time.Hour, 4, 1024)
	s.replace([]*object.Object{{Key: "/a", RV: 1}, {Key: "/b", RV: 1}}, 1)
	l.Reset(1)

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
		e := &event{typ: st.typ, key: st.key, rv: rv, prev: current[st.key], recorded: time.Now()}
		if st.typ == watch.Deleted {
			e.cur = &object.Object{Key: st.key, RV: rv}
			delete(current, st.key)
			delete(state, st.key)
		} else {
			e.cur = &object.Object{Key: st.key, RV: rv}
			current[st.key] = e.cur
			state[st.key] = rv
		}
		s.apply(e)
		l.Append(e)
		if st.snapshot {
			s.latest()
		}
		want[rv] = maps.Clone(state)
	}
	if _, snapshots := s.stats(); snapshots != 3 {
		t.Errorf("%d snapshots, want 3: the list's, and two taken by lists", snapshots)
	}
	for rv := uint64(1); rv <= uint64(len(steps)+1); rv++ {
		t.Run(fmt.Sprint("rv=", rv), func(t *testing.T) {
			sn, ok := s.at(rv, l.Between)
			if !ok {
				t.Fatal("not available")
			}
			got := map[string]uint64{}
			sn.tree.Ascend(func(o *object.Object) bool { got[o.Key] = o.RV; return true })
			if !maps.Equal(got, want[rv]) || sn.rv != rv {
				t.Errorf("at(%d) = %v at %d, want %v", rv, got, sn.rv, want[rv])
			}
		})
	}
	if _, ok := s.at(uint64(len(steps)+2), l.Between); ok {
		t.Error("a future resourceVersion must not be available")
	}
	l.DropUpTo(3)
	s.prune(3)
	if _, ok := s.at(2, l.Between); ok {
		t.Error("a resourceVersion whose events left the log must not be available")
	}
	if _, ok := s.at(3, l.Between); !ok {
		t.Error("the log's start must still be available")
	}
}

// newTestLog is an event history with no byte budget.
func newTestLog(window time.Duration, minSize, maxSize int) *eventLog {
	return history.New[*event](history.Config{Window: window, MinSize: minSize, MaxSize: maxSize})
}
