package cacher

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/apiserver/pkg/storage"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"

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
	egress := &refusingEgress{refused: map[time.Time]int{}}
	dial, _ := egress.lookup(egressselector.Etcd.AsNetworkContext())
	tracker := etcdconn.New(etcdconn.Config{Dial: dial})
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
	egress.down.Store(true)
	tracker.DropQuiet(0)
	// Six refused dials take etcdReconnect about 2.6 s, and gRPC's default
	// at least 12.6 s.
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 8*time.Second, true,
		func(context.Context) (bool, error) { n, _ := egress.stats(); return n >= 6, nil }); err != nil {
		n, _ := egress.stats()
		t.Fatalf("%d dials refused in 8 s, want 6 at least: the client backs off too long", n)
	}
	egress.down.Store(false)
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

// refusingEgress is an EgressLookup to a real etcd that refuses every dial
// while down, as a killed member's port does, and remembers how many dials
// each of gRPC's connection attempts (its context) made.
type refusingEgress struct {
	down atomic.Bool

	// mu guards the fields below.
	mu    sync.Mutex
	conns []net.Conn
	// refused counts the refused dials of each of gRPC's connection
	// attempts, known by their deadline: Redial bounds each dial with a
	// context of its own, which inherits it.
	refused map[time.Time]int
}

func (e *refusingEgress) lookup(egressselector.NetworkContext) (utilnet.DialFunc, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if e.down.Load() {
			e.mu.Lock()
			deadline, _ := ctx.Deadline()
			e.refused[deadline]++
			e.mu.Unlock()
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
		}
		return c, err
	}, nil
}

// kill refuses dials from now on and closes every connection made.
func (e *refusingEgress) kill() {
	e.down.Store(true)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.conns {
		_ = c.Close()
	}
	e.conns = nil
}

// stats returns how many dials were refused, and how many connection
// attempts had 3 refused dials or more.
func (e *refusingEgress) stats() (refused, redialled int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range e.refused {
		refused += n
		if n >= 3 {
			redialled++
		}
	}
	return refused, redialled
}

// TestReadinessCheckRedialsARefusedMember checks RedialEtcd on the
// storage-readiness check the generic server builds (/readyz's
// etcd-readiness): cut off from a real etcd whose dials are refused, its
// client dials again about every second, not at gRPC's default pace (1 s
// growing by 1.6 a time: 6 dials take it 12.6 s), and the check passes
// within a few seconds of etcd taking dials again.
func TestReadinessCheckRedialsARefusedMember(t *testing.T) {
	server := newTestEtcd(t)
	egress := &refusingEgress{refused: map[time.Time]int{}}
	config := storagebackend.NewDefaultConfig(etcd3testing.PathPrefix(), examplev1Blob)
	config.Transport = storagebackend.TransportConfig{ServerList: server.V3Client.Endpoints(), EgressLookup: egress.lookup}
	RedialEtcd(&config.Transport)
	stop := make(chan struct{})
	defer close(stop)
	check, err := factory.CreateReadyCheck(*config, stop)
	if err != nil {
		t.Fatal(err)
	}
	ready := func(context.Context) (bool, error) { return check() == nil, nil }
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true, ready); err != nil {
		t.Fatalf("the readiness check never passed: %v", check())
	}
	egress.kill()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 8*time.Second, true,
		func(context.Context) (bool, error) { n, _ := egress.stats(); return n >= 6, nil }); err != nil {
		n, _ := egress.stats()
		t.Fatalf("%d dials refused in 8 s, want 6 at least: the check's client backs off as gRPC does", n)
	}
	egress.down.Store(false)
	back := time.Now()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true, ready); err != nil {
		t.Fatalf("the readiness check did not pass again: %v", check())
	}
	// The next dial within a second and its jitter, and the check's
	// probe; with room for a loaded CI machine. gRPC's own pace misses it
	// by more, and fails the count of refused dials above first.
	if d := time.Since(back); d > 5*time.Second {
		t.Errorf("the readiness check passed %v after etcd took dials again, want within 5 s", d)
	}
}

// TestStorageDecoratorRedials checks that each resource's clients, its
// etcd3 store's and its cache's, dial a refused member again within one of
// gRPC's connection attempts (RedialEtcd's behaviour), and write again once
// etcd takes dials.
func TestStorageDecoratorRedials(t *testing.T) {
	server := newTestEtcd(t)
	egress := &refusingEgress{refused: map[time.Time]int{}}
	config := &storagebackend.ConfigForResource{
		Config: storagebackend.Config{
			Type:      storagebackend.StorageTypeETCD3,
			Prefix:    etcd3testing.PathPrefix(),
			Transport: storagebackend.TransportConfig{ServerList: server.V3Client.Endpoints(), EgressLookup: egress.lookup},
			Codec:     examplev1Blob,
		},
		GroupResource: schema.GroupResource{Resource: "pods"},
	}
	prefix := "/pods/"
	s, destroy, err := StorageDecorator(Config{ConsistencyCheckInterval: -1})(config, prefix,
		func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(prefix, obj) },
		func() runtime.Object { return &example.Pod{} }, func() runtime.Object { return &example.PodList{} },
		podAttrs, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer destroy()
	create := func(name string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		return s.Create(ctx, prefix+"ns/"+name, pod, &example.Pod{}, 0)
	}
	if err := create("before", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The cache's client reconnects for its etcd watch, which it opens once
	// its first list is done: killed before that, on a loaded machine, only
	// the store's client had anything to reconnect for (a clean clone's CI,
	// 2026-11-30: 11 dials refused, all in one attempt).
	waitReady(t, s.(*Cacher))
	egress.kill()
	// The store's client and the cache's each keep one attempt going.
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 8*time.Second, true,
		func(context.Context) (bool, error) { _, r := egress.stats(); return r >= 2, nil }); err != nil {
		n, r := egress.stats()
		t.Fatalf("%d dials refused in 8 s, %d attempts with 3 dials or more, want 2: a client does not redial", n, r)
	}
	egress.down.Store(false)
	back := time.Now()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return create("after", time.Second) == nil, nil }); err != nil {
		t.Fatal("the store did not write again")
	}
	if d := time.Since(back); d > 5*time.Second {
		t.Errorf("the store wrote %v after etcd took dials again, want within 5 s", d)
	}
}
