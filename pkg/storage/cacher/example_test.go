package cacher_test

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	genericapiserver "k8s.io/apiserver/pkg/server"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

// A generic apiserver serves its resources' lists and watches from this
// cache by wrapping its RESTOptionsGetter before it builds its REST
// storages: one line, as examples/sample-apiserver adds to the wardle
// server. A zero Config takes every default; its fields are the knobs.
func ExampleWithStorageDecorator() {
	scheme := runtime.NewScheme()
	cfg := genericapiserver.NewRecommendedConfig(serializer.NewCodecFactory(scheme))
	// ... the server's options' ApplyTo(cfg) sets cfg.RESTOptionsGetter
	// from the etcd flags, then:
	cfg.RESTOptionsGetter = cacher.WithStorageDecorator(cfg.RESTOptionsGetter, cacher.StorageDecorator(cacher.Config{}))
	// ... and every storage New builds from cfg.RESTOptionsGetter is cached.
}
