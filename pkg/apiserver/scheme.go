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

// servedSerializer is the group's serializer with the media types it
// serves, worked out once:
//
//   - protobuf is hidden. The fleet types have no protobuf encoding, so
//     advertising it would let a client negotiate an encoding that then
//     fails. With it hidden, a client that offers protobuf with a JSON
//     fallback gets JSON, and one that accepts only protobuf gets 406 Not
//     Acceptable (415 for a protobuf request body).
//   - JSON watch events are framed by watchEventEncoder.
type servedSerializer struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func newServedSerializer(ns runtime.NegotiatedSerializer) servedSerializer {
	var infos []runtime.SerializerInfo
	for _, info := range ns.SupportedMediaTypes() {
		if info.MediaType != runtime.ContentTypeProtobuf {
			infos = append(infos, info)
		}
	}
	return servedSerializer{NegotiatedSerializer: ns, infos: withWatchEventEncoder(infos)}
}

// SupportedMediaTypes implements runtime.NegotiatedSerializer.
func (s servedSerializer) SupportedMediaTypes() []runtime.SerializerInfo {
	return s.infos
}
