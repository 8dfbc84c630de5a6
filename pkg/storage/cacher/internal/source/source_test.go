package source

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"k8s.io/apiserver/pkg/apis/example"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// TestRunFollowsEtcd drives a source through a fake etcd: it lists, becomes
// ready, applies events, drops an event etcd repeats, and re-watches from
// its head when the watch closes, without listing again or ending watchers.
func TestRunFollowsEtcd(t *testing.T) {
	h := newHarness(newFakeEtcd(3, pod("a", 2), pod("b", 3)), nil)
	h.run(t)
	first := h.etcd.next(t)
	h.waitState(t, Ready)
	if first.rv != "3" {
		t.Errorf("the first watch starts after %s, want the list's 3", first.rv)
	}
	if _, ok := h.cache.Get("/pods/ns/b"); !ok || h.cache.lists() != 1 {
		t.Fatalf("after the list: b held %v, %d resets; want true, 1", ok, h.cache.lists())
	}

	first.w.put(pod("a", 4))
	// etcd-io/etcd#20221: a resumed watch can repeat what it sent.
	first.w.put(pod("a", 4))
	first.w.put(pod("c", 5))
	testkit.StepUntil(t, h.clk, func() bool { return len(h.cache.seen()) == 2 })
	if got, want := h.cache.seen(), []string{"MODIFIED /pods/ns/a@4", "ADDED /pods/ns/c@5"}; !reflect.DeepEqual(got, want) {
		t.Errorf("events applied: %q, want %q", got, want)
	}
	if n := h.n.get("replayed"); n != 1 {
		t.Errorf("%d events dropped as repeats, want 1", n)
	}
	h.cache.mu.Lock()
	for _, e := range h.cache.events {
		if !sameString(e.Key, e.Cur.Key) {
			t.Errorf("%s: the event's key is a copy of its object's, which the history would hold twice", e.Key)
		}
	}
	h.cache.mu.Unlock()

	first.w.stop()
	second := h.nextWatch(t)
	if second.rv != "5" {
		t.Errorf("the re-watch starts after %s, want the head, 5", second.rv)
	}
	if n, ended := h.n.get("restarted/"+EndClosed), h.cache.ended(); n != 1 || len(ended) != 0 || h.cache.lists() != 1 {
		t.Errorf("after the watch closed: %d restarts, watchers ended %q, %d lists; want 1, none, 1", n, ended, h.cache.lists())
	}
	if s, _ := h.ready.Get(); s != Ready {
		t.Errorf("state %d after a re-watch, want Ready", s)
	}
}

// nextWatch waits for the source to open its next watch, moving the fake
// clock past the wait before it.
func (h *harness) nextWatch(t *testing.T) openedWatch {
	t.Helper()
	testkit.StepUntil(t, h.clk, func() bool { return len(h.etcd.watches) > 0 })
	return h.etcd.next(t)
}

// TestWatchEnds checks what the source does with each way its etcd watch
// can end: re-watch from its head, with watchers kept, or list again and
// end them, counting either under the reason.
func TestWatchEnds(t *testing.T) {
	tests := []struct {
		name string
		end  func(w *fakeStream)
		// restart or relist is the reason counted.
		restart, relist string
	}{
		{name: "closed", end: func(w *fakeStream) { w.stop() }, restart: EndClosed},
		{name: "no leader", end: func(w *fakeStream) { w.end(classifyEtcd(rpctypes.ErrNoLeader)) }, restart: EndNoLeader},
		{name: "etcd unavailable", end: func(w *fakeStream) {
			w.end(classifyEtcd(rpctypes.ErrGRPCLeaderChanged))
		}, restart: EndUnavailable},
		{name: "compacted", end: func(w *fakeStream) { w.end(classifyEtcd(rpctypes.ErrCompacted)) }, relist: EndCompacted},
		{name: "an object that does not build", end: func(w *fakeStream) {
			w.send(Response{Changes: []Change{{Key: "/pods/ns/x", Rev: 5, Object: &example.PodList{}}}})
		}, relist: EndUnreadable},
		{name: "a value that does not read", end: func(w *fakeStream) {
			// As EtcdChanges ends a watch on a put it cannot decrypt or decode.
			w.end(End{Reason: EndUnreadable, Relist: true, Err: fmt.Errorf("reading /pods/ns/a at 5: bad")})
		}, relist: EndUnreadable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			etcd := newFakeEtcd(3, pod("a", 2), pod("b", 3))
			h := newHarness(etcd, nil)
			h.run(t)
			first := etcd.next(t)
			h.waitState(t, Ready)
			etcd.set(7, pod("a", 6))
			tc.end(first.w)
			second := h.nextWatch(t)
			h.waitState(t, Ready)
			restarts, relists := h.n.get("restarted/"+tc.restart), h.n.get("relisted/"+tc.relist)
			ended := h.cache.ended()
			if tc.restart != "" {
				if restarts != 1 || len(ended) != 0 || h.cache.lists() != 1 || second.rv != "3" {
					t.Errorf("got %d restarts, watchers ended %q, %d lists, re-watch after %s; want 1, none, 1, after 3",
						restarts, ended, h.cache.lists(), second.rv)
				}
				return
			}
			if relists != 1 || len(ended) != 1 || !strings.Contains(ended[0], tc.relist) || h.cache.lists() != 2 || second.rv != "7" {
				t.Errorf("got %d re-lists, watchers ended %q, %d lists, watch after %s; want 1, once for %s, 2, after 7",
					relists, ended, h.cache.lists(), second.rv, tc.relist)
			}
			if _, ok := h.cache.Get("/pods/ns/b"); ok {
				t.Error("the re-list kept b, which etcd no longer holds")
			}
		})
	}
}

// TestRevisionsWhole checks that the source hands the cache each etcd
// revision whole, in one Process, however etcd's responses group them,
// with deletions of what the cache never held left out; that a repeated
// revision is dropped whole; and that a progress notification ahead of an
// event neither drops the event nor counts it a repeat (issue 56: the
// repeat check compared events with the head, which progress moves).
func TestRevisionsWhole(t *testing.T) {
	h := newHarness(newFakeEtcd(3, pod("a", 2), pod("b", 3)), nil)
	h.run(t)
	w := h.etcd.next(t).w
	h.waitState(t, Ready)

	// A transaction at 4: a, b and c; a lease revoked at 5: a, b, and x,
	// which the cache never held; then 6 and 7 in one response.
	w.put(pod("a", 4), pod("b", 4), pod("c", 4))
	w.del(pod("a", 5), pod("b", 5), pod("x", 5))
	w.put(pod("d", 6), pod("e", 7), pod("f", 7))
	// A repeat of 4, whole.
	w.put(pod("a", 4), pod("b", 4), pod("c", 4))
	// A progress notification ahead of the next event, which must still apply.
	w.send(Response{Progress: 9})
	w.put(pod("g", 8))
	// Every change sent was received, applied or not.
	testkit.StepUntil(t, h.clk, func() bool { return h.n.get("received") == 13 })
	want := []string{"MODIFIED /pods/ns/a@4", "MODIFIED /pods/ns/b@4", "ADDED /pods/ns/c@4",
		"DELETED /pods/ns/a@5", "DELETED /pods/ns/b@5", "ADDED /pods/ns/d@6", "ADDED /pods/ns/e@7", "ADDED /pods/ns/f@7",
		"ADDED /pods/ns/g@8"}
	if got := h.cache.seen(); !reflect.DeepEqual(got, want) {
		t.Errorf("events applied:\n%q\nwant\n%q", got, want)
	}
	h.cache.mu.Lock()
	revisions := append([]int(nil), h.cache.revisions...)
	h.cache.mu.Unlock()
	if want := []int{3, 2, 1, 2, 1}; !reflect.DeepEqual(revisions, want) {
		t.Errorf("events per Process: %v, want one call a revision, %v", revisions, want)
	}
	if n := h.n.get("replayed"); n != 3 {
		t.Errorf("%d events dropped as repeats, want the 3 of the repeated revision", n)
	}
}
