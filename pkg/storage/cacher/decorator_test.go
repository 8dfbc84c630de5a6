package cacher

import (
	"context"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/apiserver/pkg/storage"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	"k8s.io/apiserver/pkg/storage/storagebackend"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/etcdconn"
)

// TestStorageDecoratorTracksConnections checks that each resource's etcd
// connections, its store's and its cache's, are dialled through a tracker
// of its own, which is its cache's ConnectionDropper, that closing one
// resource's quiet connections leaves another's open, and that a
// transport's own egress dialer still makes the connections.
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
	if trackers[0] == trackers[1] {
		t.Fatal("the resources share a tracker: a silent watch of one would close the other's quiet connections")
	}
	// The storage factory waits until its client is connected; each
	// cache's client connects as its watch opens.
	for i, tr := range trackers {
		if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true,
			func(context.Context) (bool, error) { return tr.Open() >= 2, nil }); err != nil {
			t.Fatalf("resource %d's tracker holds %d open connections, want its store's and its cache's", i, tr.Open())
		}
	}
	open := []int{trackers[0].Open(), trackers[1].Open()}
	// Every connection is quiet for 0 s or more.
	if closed := trackers[0].DropQuiet(0); closed != open[0] {
		t.Errorf("DropQuiet closed %d of the resource's %d connections", closed, open[0])
	}
	if n := trackers[1].Open(); n != open[1] {
		t.Errorf("closing one resource's connections left the other %d open of %d", n, open[1])
	}
	if egressDials.Load() < 4 {
		t.Errorf("the transport's egress dialer made %d connections, want every one", egressDials.Load())
	}
}

// TestCacheClientRedialsEverySecond cuts the cache's etcd client off from
// a real etcd, refusing its dials, and checks that it tries again at
// etcdReconnect's pace, not gRPC's default (1 s growing by 1.6 a time),
// and is back within a second of etcd taking its dials again.
func TestCacheClientRedialsEverySecond(t *testing.T) {
	server := newTestEtcd(t)
	var down atomic.Bool
	var refused atomic.Int32
	tracker := etcdconn.New(etcdconn.Config{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if down.Load() {
			refused.Add(1)
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}})
	client, err := newEtcdClient(storagebackend.TransportConfig{ServerList: server.V3Client.Endpoints()}, tracker)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	get := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := client.Get(ctx, "/x")
		return err
	}
	if err := get(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	tracker.DropQuiet(0)
	// Six refused dials take etcdReconnect about 2.6 s, and gRPC's default
	// at least 12.6 s.
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 8*time.Second, true,
		func(context.Context) (bool, error) { return refused.Load() >= 6, nil }); err != nil {
		t.Fatalf("%d dials refused in 8 s, want 6 at least: the client backs off too long", refused.Load())
	}
	down.Store(false)
	back := time.Now()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return get(time.Second) == nil, nil }); err != nil {
		t.Fatal("the client did not reach etcd again")
	}
	// The next dial comes within MaxDelay and its jitter; allow a request.
	if d := time.Since(back); d > 2*time.Second {
		t.Errorf("the client reached etcd %v after it took dials again, want within about a second", d)
	}
}
