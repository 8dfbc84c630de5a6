package source

import (
	"slices"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// TestWatchStreams checks that each etcd watch is on a gRPC stream of its
// own, and that every progress request, a reader's included, goes to the
// stream of the watch open at the time: a notification from a stream
// another watch shares can report a revision before the new watch's first
// events (streamContext).
func TestWatchStreams(t *testing.T) {
	etcd := newFakeEtcd(3, pod("a", 2))
	h := newHarness(etcd, nil)
	h.run(t)
	first := etcd.next(t)
	h.waitState(t, Ready)
	// askedOn asks as a reader does and returns the streams asked on since n requests.
	askedOn := func(n int) []string {
		t.Helper()
		h.src.RequestProgress()
		testkit.StepUntil(t, h.clk, func() bool { return len(etcd.progressRequests()) > n })
		return etcd.progressRequests()[n:]
	}
	got := askedOn(1)
	if all := etcd.progressRequests(); all[0] != first.stream || slices.ContainsFunc(got, func(s string) bool { return s != first.stream }) {
		t.Errorf("progress requests went to streams %q; want only the first watch's, %q", all, first.stream)
	}

	first.w.Stop()
	second := h.nextWatch(t)
	if second.stream == first.stream {
		t.Fatalf("the re-opened watch shares the first one's stream, %q", first.stream)
	}
	// The watch asks once as it opens.
	testkit.StepUntil(t, h.clk, func() bool { return slices.Contains(etcd.progressRequests(), second.stream) })
	n := len(etcd.progressRequests())
	if got := askedOn(n); slices.ContainsFunc(got, func(s string) bool { return s != second.stream }) {
		t.Errorf("after the re-watch, progress requests went to %q; want only the new watch's stream, %q", got, second.stream)
	}
}
