package fanout

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// TestAtBetweenApplyAndAppend checks that the state at an exact
// resourceVersion, asked for between the store's apply of the next revision
// and the log's append of it (inside Process, which the test plays by hand
// under the dispatcher's lock), does not hold that revision: its base was
// taken where the log could not undo it, and an exact list at 2 held the
// pod written at 3 (issue 65).
func TestAtBetweenApplyAndAppend(t *testing.T) {
	d := newTestDispatcher(100)
	d.put("a", nil, "") // 2
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns", ResourceVersion: "3"}}
	e := &Event{Type: watch.Added, Key: "/pods/ns/b", Rev: 3, Cur: objecttest.PodObject(pod), Seen: d.clock.Now().UnixNano()}

	d.mu.Lock()
	d.store.Apply(e)
	got := make(chan store.Snapshot, 1)
	go func() {
		snap, ok := d.At(2)
		if !ok {
			t.Error("no state at 2")
		}
		got <- snap
	}()
	// At waits for the lock; a moment's grace shows it does not answer
	// without it.
	select {
	case snap := <-got:
		d.mu.Unlock()
		t.Fatalf("the state at 2 answered between the apply and the append of 3: %v", keys(snap))
	case <-time.After(50 * time.Millisecond):
	}
	d.log.Append(e)
	d.mu.Unlock()
	snap, _ := testkit.Recv(t, got, "the state at 2")
	if k := keys(snap); fmt.Sprint(k) != "[/pods/ns/a]" || snap.RV != 2 {
		t.Errorf("the state at 2: %v at %d, want [/pods/ns/a] at 2", k, snap.RV)
	}
}

// keys lists a snapshot's keys.
func keys(snap store.Snapshot) []string {
	var out []string
	snap.Scan("", true, "", func(o *object.Object) bool {
		out = append(out, o.Key)
		return true
	})
	return out
}
