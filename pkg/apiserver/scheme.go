package apiserver

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/install"
)

var (
	// Scheme holds the fleet types and the meta types the server needs.
	Scheme = runtime.NewScheme()
	// Codecs serializes the types in Scheme.
	Codecs = serializer.NewCodecFactory(Scheme)
)

func init() {
	install.Install(Scheme)
	// The generic server decodes its query-parameter options as v1 types.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	unversioned := schema.GroupVersion{Group: "", Version: "v1"}
	Scheme.AddUnversionedTypes(unversioned,
		&metav1.Status{},
		&metav1.APIVersions{},
		&metav1.APIGroupList{},
		&metav1.APIGroup{},
		&metav1.APIResourceList{},
	)
}

// withoutProtobuf hides the protobuf serializer. The fleet types have no
// protobuf encoding, so advertising it would let a client negotiate an
// encoding that then fails. With it hidden, a client that offers protobuf
// with a JSON fallback gets JSON, and one that accepts only protobuf gets 406
// Not Acceptable (415 for a protobuf request body).
type withoutProtobuf struct {
	runtime.NegotiatedSerializer
}

// SupportedMediaTypes implements runtime.NegotiatedSerializer.
func (s withoutProtobuf) SupportedMediaTypes() []runtime.SerializerInfo {
	all := s.NegotiatedSerializer.SupportedMediaTypes()
	out := make([]runtime.SerializerInfo, 0, len(all))
	for _, info := range all {
		if info.MediaType != runtime.ContentTypeProtobuf {
			out = append(out, info)
		}
	}
	return out
}
