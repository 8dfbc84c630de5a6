package object

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/versioning"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
)

// BenchmarkDecode compares, in one run, decoding a cached pod of about
// 1 KiB (bench-scale's shape: a label, a 1 KiB annotation, one
// managedFields entry) with the storage's serializer and with jsonDecoder,
// each defaulted and converted to the internal type as the cache does.
//
//	go test ./pkg/storage/cacher/internal/object -run '^$' -bench Decode -count 5
func BenchmarkDecode(b *testing.B) {
	pod := benchPod()
	o, err := newIngest(codecs.LegacyCodec(examplev1.SchemeGroupVersion), scheme).Build(pod)
	if err != nil {
		b.Fatal(err)
	}
	s := jsonserializer.NewSerializerWithOptions(headerMeta{}, scheme, scheme, jsonserializer.SerializerOptions{})
	for _, d := range []struct {
		name    string
		decoder runtime.Decoder
	}{
		{"serializer", s},
		{"jsoniter", &jsonDecoder{scheme: scheme, serializer: s, safe: map[reflect.Type]bool{}}},
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
}
