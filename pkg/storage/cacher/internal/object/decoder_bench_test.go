package object

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/versioning"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
)

// BenchmarkDecode compares, in one run, decoding a cached pod of about
// 1 KiB and of 10 KiB (bench-scale's shapes: a label, an annotation of
// that size, one managedFields entry) with the storage's serializer and
// with jsonDecoder, each defaulted and converted to the internal type as
// the cache does.
//
//	go test ./pkg/storage/cacher/internal/object -run '^$' -bench Decode -count 5
func BenchmarkDecode(b *testing.B) {
	for _, size := range []int{1 << 10, 10 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { benchmarkDecode(b, benchPod(size)) })
	}
}

func benchmarkDecode(b *testing.B, pod *example.Pod) {
	o, err := newIngest(codecs.LegacyCodec(examplev1.SchemeGroupVersion), scheme).Build(pod)
	if err != nil {
		b.Fatal(err)
	}
	exact := newJSONDecoder(scheme, false)
	for _, d := range []struct {
		name    string
		decoder runtime.Decoder
	}{
		{"serializer", exact.serializer},
		{"exact", exact},
		{"exact-shared", newJSONDecoder(scheme, true)},
	} {
		codec := versioning.NewDefaultingCodecForScheme(scheme, nil, d.decoder, nil, runtime.InternalGroupVersioner)
		b.Run(d.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := codec.Decode(o.Raw, nil, &example.Pod{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// deepcopy is what a hit in a cache of decoded objects would cost at
	// the least: its callers own what they are given, so it must copy.
	b.Run("deepcopy", func(b *testing.B) {
		decoded, err := o.Decode()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			_ = decoded.DeepCopyObject()
		}
	})
}
