package cacher

import (
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/apis/example"
)

// TestApproximateSize checks the estimate against the object's JSON size,
// which is close to what it holds decoded for string-heavy objects, and
// that it follows what the object references.
func TestApproximateSize(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload int
	}{
		{"empty", 0},
		{"1 KiB annotation", 1024},
		{"10 KiB annotation", 10 * 1024},
		{"100 KiB annotation", 100 * 1024},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "12",
				Labels: map[string]string{"app": "x"}}, Spec: example.PodSpec{NodeName: "node-1"}}
			if tc.payload > 0 {
				pod.Annotations = map[string]string{"payload": strings.Repeat("x", tc.payload)}
			}
			raw, err := json.Marshal(pod)
			if err != nil {
				t.Fatal(err)
			}
			got := approximateSize(pod)
			// Within a decoded object's struct overhead of its JSON size.
			if got < int64(tc.payload) || got > int64(len(raw))+4096 {
				t.Errorf("approximateSize = %d, JSON is %d bytes, payload %d", got, len(raw), tc.payload)
			}
		})
	}
}
