package cacher

import (
	"bytes"
	"io"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	testingclock "k8s.io/utils/clock/testing"
)

// TestEncodingExpiry checks that watchers within the TTL share one
// encoding, that the encoding is forgotten once the TTL passed since the
// first, and that the next watcher encodes again.
func TestEncodingExpiry(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	x := newEncodingExpiry(10*time.Second, clk)
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	co := newCachingObject(pod)
	co.expiry = x
	encodes := 0
	encode := func(obj runtime.Object, w io.Writer) error {
		encodes++
		_, err := w.Write([]byte("encoded"))
		return err
	}
	send := func() {
		t.Helper()
		var buf bytes.Buffer
		if err := co.CacheEncode("json", encode, &buf); err != nil || buf.String() != "encoded" {
			t.Fatalf("CacheEncode: %q, %v", buf.String(), err)
		}
	}

	send()
	clk.Step(9 * time.Second)
	send()
	if n := x.expire(); n != 0 || encodes != 1 {
		t.Fatalf("within the TTL: %d expired, %d encodes; want 0, 1", n, encodes)
	}
	clk.Step(time.Second)
	if n := x.expire(); n != 1 || x.len() != 0 {
		t.Fatalf("at the TTL: %d expired, %d left; want 1, 0", n, x.len())
	}
	co.mu.RLock()
	held := len(co.encodings)
	co.mu.RUnlock()
	if held != 0 {
		t.Fatalf("%d encodings kept after the TTL", held)
	}
	send()
	if encodes != 2 || x.len() != 1 {
		t.Fatalf("after the TTL: %d encodes, %d queued; want 2, 1", encodes, x.len())
	}
}
