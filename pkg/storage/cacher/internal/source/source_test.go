package source

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
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

	first.w.Modify(pod("a", 4))
	// etcd-io/etcd#20221: a resumed watch can repeat what it sent.
	first.w.Modify(pod("a", 4))
	first.w.Add(pod("c", 5))
	testkit.StepUntil(t, h.clk, func() bool { return len(h.cache.seen()) == 2 })
	if got, want := h.cache.seen(), []string{"MODIFIED /pods/ns/a@4", "ADDED /pods/ns/c@5"}; !reflect.DeepEqual(got, want) {
		t.Errorf("events applied: %q, want %q", got, want)
	}
	if n := h.n.get("replayed"); n != 1 {
		t.Errorf("%d events dropped as repeats, want 1", n)
	}

	first.w.Stop()
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
		end  func(w *watch.FakeWatcher)
		// restart or relist is the reason counted.
		restart, relist string
	}{
		{name: "closed", end: func(w *watch.FakeWatcher) { w.Stop() }, restart: EndClosed},
		{name: "no leader", end: func(w *watch.FakeWatcher) {
			w.Error(&apierrors.NewInternalError(rpctypes.ErrNoLeader).ErrStatus)
		}, restart: EndNoLeader},
		{name: "etcd unavailable", end: func(w *watch.FakeWatcher) {
			w.Error(&apierrors.NewInternalError(fmt.Errorf("rpc error: code = Unavailable")).ErrStatus)
		}, restart: EndUnavailable},
		{name: "compacted", end: func(w *watch.FakeWatcher) {
			w.Error(&apierrors.NewResourceExpired("required revision has been compacted").ErrStatus)
		}, relist: EndCompacted},
		{name: "an object that does not build", end: func(w *watch.FakeWatcher) {
			w.Add(&example.PodList{})
		}, relist: EndUnreadable},
		{name: "a bookmark with a resourceVersion that does not parse", end: func(w *watch.FakeWatcher) {
			w.Action(watch.Bookmark, &example.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "x"}})
		}, relist: EndUnreadable},
		{name: "a store read error", end: func(w *watch.FakeWatcher) {
			// As the etcd3 store reports an object it cannot decrypt or decode.
			w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonStoreReadError,
				Message: "failed to read /pods/ns/a"})
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
