package registry

import (
	"io"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// BenchmarkListEncoding encodes 10,000 assignments of 1 KiB as a list
// response in JSON: copied into the list type, as upstream's cache answers,
// and shared, as ours does.
func BenchmarkListEncoding(b *testing.B) {
	cf, infos := mediaTypes(b)
	info, _ := runtime.SerializerInfoForMediaType(infos, runtime.ContentTypeJSON)
	enc := cf.EncoderForVersion(info.Serializer, v1beta1.SchemeGroupVersion)
	cached := assignments(10_000, 1024)
	b.Run("copied", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l := &fleet.AssignmentList{Items: append([]fleet.Assignment(nil), cached...)}
			if err := enc.Encode(l, io.Discard); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("shared", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := enc.Encode(share(cached, metav1.ListMeta{}), io.Discard); err != nil {
				b.Fatal(err)
			}
		}
	})
}
