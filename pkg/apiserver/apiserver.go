// Package apiserver assembles the fleet.example.com API server from a
// generic server config.
package apiserver

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry/fleet/agent"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry/fleet/assignment"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

// ExtraConfig is what the fleet server needs beyond the generic config.
type ExtraConfig struct {
	// StorageDecorator wraps each resource's etcd3 storage; see StorageDecorator.
	StorageDecorator generic.StorageDecorator
}

// Config is the full server config.
type Config struct {
	GenericConfig *genericapiserver.RecommendedConfig
	ExtraConfig   ExtraConfig
}

// Server is the running fleet API server.
type Server struct {
	GenericAPIServer *genericapiserver.GenericAPIServer
}

type completedConfig struct {
	GenericConfig genericapiserver.CompletedConfig
	ExtraConfig   *ExtraConfig
}

// CompletedConfig is a Config with defaults filled in; only Complete makes one.
type CompletedConfig struct {
	*completedConfig
}

// Complete fills in defaults. It mutates the receiver.
func (cfg *Config) Complete() CompletedConfig {
	if cfg.ExtraConfig.StorageDecorator == nil {
		cfg.ExtraConfig.StorageDecorator = StorageDecorator(WatchCacheOptions{Enabled: true})
	}
	return CompletedConfig{&completedConfig{cfg.GenericConfig.Complete(), &cfg.ExtraConfig}}
}

// New builds the server and installs fleet.example.com in both versions.
func (c completedConfig) New() (*Server, error) {
	genericServer, err := c.GenericConfig.New("cached-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}
	s := &Server{GenericAPIServer: genericServer}

	optsGetter := cacher.WithStorageDecorator(c.GenericConfig.RESTOptionsGetter, c.ExtraConfig.StorageDecorator)
	assignments, err := assignment.NewStorage(Scheme, optsGetter)
	if err != nil {
		return nil, fmt.Errorf("assignment storage: %w", err)
	}
	agents, err := agent.NewStorage(Scheme, optsGetter)
	if err != nil {
		return nil, fmt.Errorf("agent storage: %w", err)
	}
	resources := map[string]rest.Storage{
		"assignments":        assignments.Main,
		"assignments/status": assignments.Status,
		"agents":             agents.Main,
		"agents/status":      agents.Status,
	}

	apiGroupInfo := newAPIGroupInfo()
	apiGroupInfo.VersionedResourcesStorageMap["v1beta1"] = resources
	apiGroupInfo.VersionedResourcesStorageMap["v1alpha1"] = resources
	if err := s.GenericAPIServer.InstallAPIGroup(&apiGroupInfo); err != nil {
		return nil, err
	}
	// /readyz fails until every resource's watch cache has listed, as
	// kube-apiserver's: InstallAPIGroup registers each storage with the
	// hook, but only a server that adds the hook waits for it. Without it
	// /readyz said ready seconds before the caches answered anything but
	// 429, and a rolling update took the next old pod down meanwhile
	// (issue 56). The hook gives up, and reports ready, once
	// --storage-initialization-timeout passes; a later re-list does not
	// make /readyz fail, which would take every replica out at once.
	if inject.On(inject.ReadyzWithoutCache) {
		return s, nil
	}
	if err := s.GenericAPIServer.AddPostStartHook("storage-readiness", s.GenericAPIServer.StorageReadinessHook.Hook); err != nil {
		return nil, err
	}
	return s, nil
}

// newAPIGroupInfo returns fleet.example.com's group info without storage.
// Its serializer is the generic server's default, which writes lists item
// by item (KEP-5116: a list response never exists whole in memory), as
// servedSerializer serves it. Wrapping a plain CodecFactory instead would
// lose the streaming encoders; TestListsStream fails if that happens.
func newAPIGroupInfo() genericapiserver.APIGroupInfo {
	info := genericapiserver.NewDefaultAPIGroupInfo(fleet.GroupName, Scheme, metav1.ParameterCodec, Codecs)
	info.NegotiatedSerializer = newServedSerializer(info.NegotiatedSerializer)
	return info
}
