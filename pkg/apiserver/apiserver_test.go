package apiserver

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// writeRecorder records the size of every write.
type writeRecorder struct {
	writes []int
	total  int
}

func (w *writeRecorder) Write(p []byte) (int, error) {
	w.writes = append(w.writes, len(p))
	w.total += len(p)
	return len(p), nil
}

// TestListsStream encodes a large list with the serializer the group is
// installed with and requires it to be written item by item, as the
// generic server's streaming collection encoders do: no single write
// holds more than a few items. A serializer that builds the response in
// memory writes it whole, in one write of every item, and fails here.
//
// YAML has no streaming encoder upstream either; it is the one media type
// exempt, and kubectl asks for JSON.
func TestListsStream(t *testing.T) {
	const items = 200
	list := &v1beta1.AssignmentList{}
	for i := range items {
		list.Items = append(list.Items, v1beta1.Assignment{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("a-%d", i), Namespace: "ns", ResourceVersion: "7",
				Annotations: map[string]string{"payload": strings.Repeat("x", 1024)}},
			Spec: v1beta1.AssignmentSpec{AgentName: "agent"},
		})
	}
	ns := newAPIGroupInfo().NegotiatedSerializer
	tested := 0
	for _, info := range ns.SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeYAML {
			continue
		}
		t.Run(info.MediaType, func(t *testing.T) {
			tested++
			var w writeRecorder
			enc := ns.EncoderForVersion(info.Serializer, v1beta1.SchemeGroupVersion)
			if err := enc.Encode(list.DeepCopy(), &w); err != nil {
				t.Fatal(err)
			}
			largest := 0
			for _, n := range w.writes {
				largest = max(largest, n)
			}
			if w.total < items*1024 {
				t.Fatalf("encoded %d bytes, want at least %d", w.total, items*1024)
			}
			// One item is about 1.2 KiB; a buffered writer may gather a few.
			if largest > w.total/10 {
				t.Errorf("largest write is %d of %d bytes in %d writes: the list is not streamed", largest, w.total, len(w.writes))
			}
		})
	}
	if tested == 0 {
		t.Fatal("no media type besides YAML")
	}
}
