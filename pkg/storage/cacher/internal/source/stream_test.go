package source

import (
	"slices"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// TestWatchStreams checks that every progress request, a reader's
// included, goes to the watch open at the time, and so to its own stream
// (EtcdChanges): a notification from a stream another watch shares can
// report a revision before the new watch's first events.
func TestWatchStreams(t *testing.T) {
	etcd := newFakeEtcd(3, pod("a", 2))
	h := newHarness(etcd, nil)
	h.run(t)
	first := etcd.next(t)
	h.waitState(t, Ready)
	// askedOn asks as a reader does and returns the streams asked on since n requests.
	askedOn := func(n int) []int {
		t.Helper()
		h.src.RequestProgress()
		testkit.StepUntil(t, h.clk, func() bool { return len(etcd.progressRequests()) > n })
		return etcd.progressRequests()[n:]
	}
	got := askedOn(1)
	if all := etcd.progressRequests(); all[0] != first.stream || slices.ContainsFunc(got, func(s int) bool { return s != first.stream }) {
		t.Errorf("progress requests went to watches %v; want only the first's, %d", all, first.stream)
	}

	first.w.stop()
	second := h.nextWatch(t)
	if second.stream == first.stream {
		t.Fatalf("the re-opened watch is the first one, %d", first.stream)
	}
	// The watch asks once as it opens.
	testkit.StepUntil(t, h.clk, func() bool { return slices.Contains(etcd.progressRequests(), second.stream) })
	n := len(etcd.progressRequests())
	if got := askedOn(n); slices.ContainsFunc(got, func(s int) bool { return s != second.stream }) {
		t.Errorf("after the re-watch, progress requests went to %v; want only the new watch's, %d", got, second.stream)
	}
}
