package object

import (
	"bytes"
	"strings"
	"testing"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/apis/example"
)

// TestKeyInSlack checks that a key goes into the room after an object's
// bytes when it fits, that the bytes end where they did, and that nothing
// else is touched.
func TestKeyInSlack(t *testing.T) {
	for _, tc := range []struct {
		name     string
		len, cap int
		key      string
		inSlack  bool
	}{
		{"fits", 1645, 1792, "/registry/fleet.example.com/assignments/ns-1/a-000001", true},
		{"fits exactly", 10, 14, "/a/b", true},
		{"one byte short", 10, 13, "/a/b", false},
		{"no room", 16, 16, "/a/b", false},
		{"no key", 10, 16, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := make([]byte, tc.len, tc.cap)
			for i := range raw {
				raw[i] = 'x'
			}
			key := strings.Clone(tc.key)
			gotRaw, gotKey := keyInSlack(raw, key)
			if gotKey != tc.key || len(gotRaw) != tc.len || cap(gotRaw) != tc.len || &gotRaw[0] != &raw[0] {
				t.Fatalf("got %d bytes (capacity %d) and key %q", len(gotRaw), cap(gotRaw), gotKey)
			}
			if !bytes.Equal(gotRaw, bytes.Repeat([]byte("x"), tc.len)) {
				t.Error("the bytes changed")
			}
			inSlack := tc.key != "" && tc.cap > tc.len && unsafe.StringData(gotKey) == &raw[:tc.cap][tc.len]
			if inSlack != tc.inSlack {
				t.Errorf("key in the slack: %v, want %v", inSlack, tc.inSlack)
			}
		})
	}
}

// TestTriggerInBytes checks that an object's trigger value is read from
// its bytes when they spell it, so that it holds no string of its own,
// and is kept as given when they do not.
func TestTriggerInBytes(t *testing.T) {
	for _, tc := range []struct {
		name, node string
		inBytes    bool
	}{
		{name: "plain", node: "node-7", inBytes: true},
		{name: "escaped in the JSON", node: "a<b", inBytes: false},
		{name: "empty", node: "", inBytes: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := strings.Clone(tc.node)
			o := podObject(&example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "3"},
				Spec: example.PodSpec{NodeName: node}})
			if o.Trigger != tc.node {
				t.Fatalf("trigger %q, want %q", o.Trigger, tc.node)
			}
			if got := tc.node != "" && within(unsafe.StringData(o.Trigger), o.Raw); got != tc.inBytes {
				t.Errorf("trigger in the object's bytes: %v, want %v", got, tc.inBytes)
			}
		})
	}
}
