package cacher

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/apiserver/pkg/storage"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	"k8s.io/apiserver/pkg/storage/storagebackend"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/etcdconn"
)

// TestStorageDecoratorTracksConnections checks that every resource's etcd
// connections are dialled through one tracker, which is each cache's
// ConnectionDropper, and that a transport's own egress dialer still makes
// the connections.
func TestStorageDecoratorTracksConnections(t *testing.T) {
	server := newTestEtcd(t)
	var egressDials atomic.Int32
	egress := func(egressselector.NetworkContext) (utilnet.DialFunc, error) {
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			egressDials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}, nil
	}
	decorate := StorageDecorator(Config{ConsistencyCheckInterval: -1})
	var trackers []*etcdconn.Tracker
	for _, resource := range []string{"pods", "nodes"} {
		config := &storagebackend.ConfigForResource{
			Config: storagebackend.Config{
				Type:      storagebackend.StorageTypeETCD3,
				Prefix:    etcd3testing.PathPrefix(),
				Transport: storagebackend.TransportConfig{ServerList: server.V3Client.Endpoints(), EgressLookup: egress},
				Codec:     examplev1Blob,
			},
			GroupResource: schema.GroupResource{Resource: resource},
		}
		prefix := "/" + resource + "/"
		s, destroy, err := decorate(config, prefix,
			func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(prefix, obj) },
			func() runtime.Object { return &example.Pod{} }, func() runtime.Object { return &example.PodList{} },
			podAttrs, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(destroy)
		if config.Transport.EgressLookup == nil {
			t.Fatal("the decorator changed its caller's transport")
		}
		tracker, ok := s.(*Cacher).cfg.Connections.(*etcdconn.Tracker)
		if !ok {
			t.Fatalf("%s: the cache's ConnectionDropper is %T, want the decorator's tracker", resource, s.(*Cacher).cfg.Connections)
		}
		trackers = append(trackers, tracker)
	}
	if trackers[0] != trackers[1] {
		t.Error("each resource got its own tracker; a silent watch must close every resource's quiet connections")
	}
	// The storage factory waits until its client is connected.
	if open := trackers[0].Open(); open < 2 {
		t.Errorf("the tracker holds %d open connections, want one per resource at least", open)
	}
	if egressDials.Load() < 2 {
		t.Errorf("the transport's egress dialer made %d connections, want every one", egressDials.Load())
	}
}
