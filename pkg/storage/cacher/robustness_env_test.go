package cacher

import (
	"context"
	"fmt"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	upstreamcacher "k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// The environment of a robustness run (robustness_test.go): one real etcd,
// two resources over it, one busy and one idle, each served by our cache
// and upstream's side by side, and etcd's own history of each.

// The caches a robustness run compares.
const (
	rbOurs     = "ours"
	rbUpstream = "upstream"
)

// rbImpls are the caches of every run, ours first.
var rbImpls = []string{rbOurs, rbUpstream}

// rbPod is what the checker needs of a pod: what the watchers select on.
type rbPod struct {
	tier, node string
}

// rbResource is one resource of a run.
type rbResource struct {
	name string
	// prefix is its key prefix in the storage, and etcdPrefix in etcd.
	prefix, etcdPrefix string
	// store writes it through the etcd3 store, with the storage codec.
	store storage.Interface
	// compactors are its stores' compactors, told of each compaction as
	// etcd3's compactor learns of one; compactorsMu guards them.
	compactorsMu sync.Mutex
	compactors   []interface{ UpdateCompactRevision(int64) }
	truth        *watchcheck.History[rbPod]
	caches       map[string]*rbCache
}

// rbCache is one implementation's cache of a resource, which a run may
// restart.
type rbCache struct {
	impl string
	// start makes a new cache.
	start func() (storage.Interface, func(), error)

	// mu guards cur, stop and restarts.
	mu   sync.Mutex
	cur  storage.Interface
	stop func()
	// restarts holds, for each restart, etcd's revision before it.
	restarts []int64
	// relistedCold, if set, reports whether a failpoint made ours' cache
	// re-list cold (a forced inconsistency).
	relistedCold func() bool
}

// lostHistorySince reports whether the cache had a reason to drop what it
// held after revision rev: upstream's restarts, which list cold; ours'
// restarts start warm and are no reason, but a cold re-list that a
// failpoint forced is: a cache found to differ from etcd must list again
// and end its watchers with 410, as upstream's does.
func (c *rbCache) lostHistorySince(rev int64) bool {
	if c.impl == rbOurs {
		return c.relistedCold != nil && c.relistedCold()
	}
	return c.restartedSince(rev)
}

// get returns the cache serving now.
func (c *rbCache) get() storage.Interface {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// restartedSince reports whether the cache restarted after revision rev.
func (c *rbCache) restartedSince(rev int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.restarts {
		if r >= rev {
			return true
		}
	}
	return false
}

// restart stops the cache and starts another over the same store, as a
// server restart does; etcd's revision then was rev.
func (c *rbCache) restart(rev int64) error {
	c.mu.Lock()
	stop := c.stop
	c.mu.Unlock()
	stop()
	next, nextStop, err := c.start()
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur, c.stop = next, nextStop
	c.restarts = append(c.restarts, rev)
	return nil
}

// close stops the cache for good.
func (c *rbCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stop()
}

// rbEnv is a run's etcd and resources.
type rbEnv struct {
	server *etcd3testing.EtcdTestServer
	client *clientv3.Client
	// resources are the busy resource, then the idle one.
	resources []*rbResource
}

// rbCodec is the storage codec of a run: JSON, as the server stores.
var rbCodec = examplev1JSON

// newRBEnv starts etcd, the resources and every implementation's cache of
// each.
func newRBEnv(t *testing.T, cfg func(*Config)) *rbEnv {
	t.Helper()
	server := newTestEtcd(t)
	e := &rbEnv{server: server, client: server.V3Client.Client}
	for _, name := range []string{"pods", "idle"} {
		r := &rbResource{name: name, prefix: "/" + name + "/", caches: map[string]*rbCache{}}
		r.etcdPrefix = etcd3testing.PathPrefix() + r.prefix
		newStore := func(codec runtime.Codec) storage.Interface { return e.newStore(t, r, codec, rbLeases) }
		r.store = newStore(rbCodec)
		keyFunc := func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(r.prefix, obj) }
		triggers, indexers := rbIndexes()
		ours := Config{GroupResource: schema.GroupResource{Resource: name},
			ResourcePrefix: r.prefix, KeyFunc: keyFunc, NewFunc: newBenchPod, NewListFunc: object.NewStoredList, GetAttrsFunc: podAttrs,
			IndexerFuncs: triggers, Indexers: indexers, Codec: rbCodec, Scheme: scheme,
			Client: server.V3Client.Client, StoragePrefix: etcd3testing.PathPrefix(),
			KeyReader: NewEtcdKeyReader(server.V3Client.Client, etcd3testing.PathPrefix(), r.prefix)}
		if cfg != nil {
			cfg(&ours)
		}
		// Each start is a new process's: a store of its own.
		r.caches[rbOurs] = &rbCache{impl: rbOurs, start: func() (storage.Interface, func(), error) {
			cfg := ours
			cfg.Storage = newStore(object.NewStorageCodec(rbCodec, scheme, newBenchPod))
			c, err := New(cfg)
			if err != nil {
				return nil, nil, err
			}
			return c, c.Stop, nil
		}}
		r.caches[rbUpstream] = &rbCache{impl: rbUpstream, start: func() (storage.Interface, func(), error) {
			upstreamStore := newStore(rbCodec)
			triggers, indexers := rbIndexes()
			c, err := upstreamcacher.NewCacherFromConfig(upstreamcacher.Config{
				Storage: upstreamStore, Versioner: storage.APIObjectVersioner{}, GroupResource: schema.GroupResource{Resource: name},
				EventsHistoryWindow: upstreamcacher.DefaultEventFreshDuration, ResourcePrefix: r.prefix, KeyFunc: keyFunc,
				GetAttrsFunc: podAttrs, IndexerFuncs: triggers, Indexers: indexers, NewFunc: newBenchPod,
				NewListFunc: newBenchPodList, Codec: rbCodec, Clock: clock.RealClock{}})
			if err != nil {
				return nil, nil, err
			}
			d := upstreamcacher.NewCacheDelegator(c, upstreamStore)
			return d, func() { d.Stop(); c.Stop() }, nil
		}}
		for _, c := range r.caches {
			cur, stop, err := c.start()
			if err != nil {
				t.Fatal(err)
			}
			c.cur, c.stop = cur, stop
			t.Cleanup(c.close)
		}
		e.resources = append(e.resources, r)
	}
	return e
}

// rbLeases shares no lease between TTL objects (a TTL of a second has no
// reuse), so that every one expires on time.
var rbLeases = etcd3.LeaseManagerConfig{ReuseDurationSeconds: 60, MaxObjectCount: 1000}

// newStore returns an etcd3 store of r's pods with codec and leases, whose
// compactor the run tells of its compactions.
func (e *rbEnv) newStore(t *testing.T, r *rbResource, codec runtime.Codec, leases etcd3.LeaseManagerConfig) storage.Interface {
	t.Helper()
	compactor := etcd3.NewCompactor(e.client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	r.compactorsMu.Lock()
	r.compactors = append(r.compactors, compactor)
	r.compactorsMu.Unlock()
	versioner := storage.APIObjectVersioner{}
	s, err := etcd3.New(e.server.V3Client, compactor, codec, newBenchPod, newBenchPodList, etcd3testing.PathPrefix(),
		r.prefix, schema.GroupResource{Resource: r.name}, identity.NewEncryptCheckTransformer(), leases,
		etcd3.NewDefaultDecoder(codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// rbIndexes are the trigger and indexes of a run's caches: by node.
func rbIndexes() (storage.IndexerFuncs, *cache.Indexers) {
	return storage.IndexerFuncs{"spec.nodeName": func(obj runtime.Object) string { return obj.(*example.Pod).Spec.NodeName }},
		&cache.Indexers{"f:spec.nodeName": func(obj interface{}) ([]string, error) {
			return []string{obj.(*example.Pod).Spec.NodeName}, nil
		}}
}

// followTruth starts etcd's own history of every resource, from now.
func (e *rbEnv) followTruth(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, r := range e.resources {
		prefix := etcd3testing.PathPrefix()
		decode := func(_ string, value []byte, _ int64) (*rbPod, error) {
			obj, _, err := rbCodec.Decode(value, nil, nil)
			if err != nil {
				return nil, err
			}
			pod, ok := obj.(*example.Pod)
			if !ok {
				return nil, fmt.Errorf("not a pod: %T", obj)
			}
			return &rbPod{tier: pod.Labels["tier"], node: pod.Spec.NodeName}, nil
		}
		h, err := watchcheck.Follow(ctx, e.client, r.etcdPrefix, func(k string) string { return k[len(prefix):] }, decode)
		if err != nil {
			t.Fatal(err)
		}
		r.truth = h
	}
}

// waitReady waits for every cache to serve.
func (e *rbEnv) waitReady(t *testing.T) {
	t.Helper()
	for _, r := range e.resources {
		for _, c := range r.caches {
			waitStorageReady(t, c.get())
		}
	}
}

// waitStorageReady waits until s answers its readiness check: upstream's
// cache has nothing to wait on through its delegator.
func waitStorageReady(t *testing.T, s storage.Interface) {
	t.Helper()
	testkit.Eventually(t, "a cache's readiness", func() bool { return s.ReadinessCheck() == nil })
}
