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

// TestEncodingExpiry checks that senders within the TTL share one
// cachingObject and so one encoding, that the object no longer holds it
// once the TTL passed since it was made, that a sender still holding it
// encodes again, and that the next sender gets a new one.
func TestEncodingExpiry(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	x := newEncodingExpiry(10*time.Second, clk)
	pr := &presenter{attrs: podAttrs, expiry: x}
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	o := &object{key: "/pods/ns/p", obj: pod}
	if o.co.Load() != nil {
		t.Fatal("an object that was never sent holds a cachingObject")
	}
	encodes := 0
	encode := func(obj runtime.Object, w io.Writer) error {
		encodes++
		_, err := w.Write([]byte("encoded"))
		return err
	}
	send := func(co *cachingObject) {
		t.Helper()
		var buf bytes.Buffer
		if err := co.CacheEncode("json", encode, &buf); err != nil || buf.String() != "encoded" {
			t.Fatalf("CacheEncode: %q, %v", buf.String(), err)
		}
	}

	first := pr.caching(o)
	send(first)
	clk.Step(9 * time.Second)
	if pr.caching(o) != first {
		t.Fatal("a sender within the TTL got another cachingObject")
	}
	send(first)
	if n := x.expire(); n != 0 || encodes != 1 {
		t.Fatalf("within the TTL: %d expired, %d encodes; want 0, 1", n, encodes)
	}
	clk.Step(time.Second)
	if n := x.expire(); n != 1 || x.len() != 0 {
		t.Fatalf("at the TTL: %d expired, %d left; want 1, 0", n, x.len())
	}
	if o.co.Load() != nil {
		t.Fatal("the object still holds its cachingObject after the TTL")
	}
	first.mu.RLock()
	held := len(first.encodings)
	first.mu.RUnlock()
	if held != 0 {
		t.Fatalf("%d encodings kept after the TTL", held)
	}
	send(first)
	if encodes != 2 {
		t.Fatalf("a sender holding the expired cachingObject: %d encodes, want 2", encodes)
	}
	next := pr.caching(o)
	if next == first || x.len() != 1 {
		t.Fatalf("after the TTL: same cachingObject %v, %d queued; want a new one, 1", next == first, x.len())
	}
	send(next)
	if encodes != 3 {
		t.Fatalf("the next sender: %d encodes, want 3", encodes)
	}
}
