package object

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
// Caching and so one encoding, that the object no longer holds it
// once the TTL passed since it was made, that a sender still holding it
// encodes again, and that the next sender gets a new one.
func TestEncodingExpiry(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	x := NewExpiry(10*time.Second, clk)
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	o := podObject(pod)
	if o.co.Load() != nil {
		t.Fatal("an object that was never sent holds a Caching")
	}
	encodes := 0
	encode := func(obj runtime.Object, w io.Writer) error {
		encodes++
		_, err := w.Write([]byte("encoded"))
		return err
	}
	send := func(co *Caching) {
		t.Helper()
		var buf bytes.Buffer
		if err := co.CacheEncode("json", encode, &buf); err != nil || buf.String() != "encoded" {
			t.Fatalf("CacheEncode: %q, %v", buf.String(), err)
		}
	}

	first := o.Caching(x)
	send(first)
	clk.Step(9 * time.Second)
	if o.Caching(x) != first {
		t.Fatal("a sender within the TTL got another Caching")
	}
	send(first)
	if n := x.Expire(); n != 0 || encodes != 1 {
		t.Fatalf("within the TTL: %d expired, %d encodes; want 0, 1", n, encodes)
	}
	clk.Step(time.Second)
	if n := x.Expire(); n != 1 || x.Len() != 0 {
		t.Fatalf("at the TTL: %d expired, %d left; want 1, 0", n, x.Len())
	}
	if o.co.Load() != nil {
		t.Fatal("the object still holds its Caching after the TTL")
	}
	first.mu.RLock()
	held := len(first.encodings)
	first.mu.RUnlock()
	if held != 0 {
		t.Fatalf("%d encodings kept after the TTL", held)
	}
	send(first)
	if encodes != 2 {
		t.Fatalf("a sender holding the expired Caching: %d encodes, want 2", encodes)
	}
	next := o.Caching(x)
	if next == first || x.Len() != 1 {
		t.Fatalf("after the TTL: same Caching %v, %d queued; want a new one, 1", next == first, x.Len())
	}
	send(next)
	if encodes != 3 {
		t.Fatalf("the next sender: %d encodes, want 3", encodes)
	}
}

// TestEncodingExpiryKeepsUsed checks that a Caching asked for within
// the TTL keeps its encodings past its TTL from when it was made, and goes
// once a TTL passed without a sender: watch-lists taking turns over many
// objects reach each object seconds apart, and each would otherwise encode
// it again.
func TestEncodingExpiryKeepsUsed(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	x := NewExpiry(10*time.Second, clk)
	used := podObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "used", Namespace: "ns"}})
	idle := podObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "idle", Namespace: "ns"}})

	first := used.Caching(x)
	clk.Step(2 * time.Second)
	x.Expire()
	idleCO := idle.Caching(x) // made at 1002
	clk.Step(3 * time.Second)
	x.Expire()
	if used.Caching(x) != first { // used at 1005
		t.Fatal("a sender within the TTL got another Caching")
	}
	clk.Step(5 * time.Second) // 1010: used's first TTL is over, but it was used 5 s ago
	if n := x.Expire(); n != 0 || used.co.Load() != first {
		t.Fatalf("at 1010: %d expired, kept %v; want 0, true", n, used.co.Load() == first)
	}
	clk.Step(2 * time.Second) // 1012: idle's TTL is over and it was never asked for again
	if n := x.Expire(); n != 1 || idle.co.Load() != nil || used.co.Load() != first {
		t.Fatalf("at 1012: %d expired, idle kept %v, used kept %v; want 1, false, true", n, idle.co.Load() == idleCO, used.co.Load() == first)
	}
	clk.Step(8 * time.Second) // 1020: checked again, unused for 15 s
	if n := x.Expire(); n != 1 || used.co.Load() != nil || x.Len() != 0 {
		t.Fatalf("at 1020: %d expired, used kept %v, %d queued; want 1, false, 0", n, used.co.Load() != nil, x.Len())
	}
}
