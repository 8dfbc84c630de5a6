package cacher

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/cache"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/utils/clock"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// This file runs upstream's storage conformance functions against our
// cacher over a real embedded etcd, with the example.Pod types, as
// upstream's own cacher tests do.

// The tests' objects are upstream's example pods (objecttest).
var (
	scheme        = objecttest.Scheme
	codecs        = objecttest.Codecs
	examplev1Blob = objecttest.ExampleV1Blob
	examplev1JSON = codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	podAttrs      = objecttest.PodAttrs
)

// swappableTransformer lets a test change the transformer of a running etcd3 store.
type swappableTransformer struct {
	current atomic.Pointer[value.Transformer]
}

func newSwappableTransformer(t value.Transformer) *swappableTransformer {
	s := &swappableTransformer{}
	s.current.Store(&t)
	return s
}

func (s *swappableTransformer) get() value.Transformer { return *s.current.Load() }

func (s *swappableTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swappableTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// testCacher is our cacher plus what conformance functions need around it.
type testCacher struct {
	*Cacher
	client      *clientv3.Client
	recorder    *storagetesting.KubernetesRecorder
	transformer *swappableTransformer
}

// UpdatePrefixTransformer implements storagetesting.InterfaceWithPrefixTransformer.
// The modifier gets a fresh transformer equal to withPrefixTransformer's:
// copying the live one would race with its read counter, which our ingest
// updates concurrently.
func (c *testCacher) UpdatePrefixTransformer(modify storagetesting.PrefixTransformerModifier) func() {
	original := c.transformer.get()
	modified := modify(newTestPrefixTransformer())
	c.transformer.current.Store(&modified)
	return func() { c.transformer.current.Store(&original) }
}

func newTestPrefixTransformer() *storagetesting.PrefixTransformer {
	return storagetesting.NewPrefixTransformer([]byte("test!"), false)
}

type setupOptions struct {
	// wrap wraps the etcd3 store, and changes the etcd changes the
	// cache follows, for fault injection.
	wrap    func(storage.Interface) storage.Interface
	changes func(source.Changes) source.Changes
	// config adjusts the cacher's Config.
	config        func(*Config)
	clusterScoped bool
	indexes       bool
	// keyReader gives the cache a KeyReader over the test etcd.
	keyReader   bool
	transformer value.Transformer
	codec       runtime.Codec
}

type setupOption func(*setupOptions)

func clusterScoped(o *setupOptions)         { o.clusterScoped = true }
func withNodeNameIndex(o *setupOptions)     { o.indexes = true }
func withCodec(c runtime.Codec) setupOption { return func(o *setupOptions) { o.codec = c } }

// withPrefixTransformer stores JSON behind a swappable prefix transformer,
// as etcd3's own tests do: some functions write a prefix with trailing
// whitespace, which only a JSON decoder tolerates.
func withPrefixTransformer(o *setupOptions) {
	o.transformer = newTestPrefixTransformer()
	o.codec = examplev1JSON
}

// newTestEtcd starts an embedded etcd with a client, which it closes
// before etcd stops. The etcd3 test server does not: etcd's graceful stop
// then waited for the client's open watch stream until its request
// timeout, 7 s a test.
func newTestEtcd(t testing.TB) *etcd3testing.EtcdTestServer {
	t.Helper()
	server, _ := etcd3testing.NewUnsecuredEtcd3TestClientServer(t)
	// Registered after the server's own cleanup, so run before it.
	t.Cleanup(func() { _ = server.V3Client.Close() })
	return server
}

// newTestCacher starts etcd, an etcd3 store and our cacher over it, and
// waits until the cacher is ready.
func newTestCacher(t testing.TB, opts ...setupOption) *testCacher {
	t.Helper()
	o := setupOptions{transformer: identity.NewEncryptCheckTransformer(), codec: examplev1Blob}
	for _, opt := range opts {
		opt(&o)
	}
	server := newTestEtcd(t)
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(server.V3Client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	transformer := newSwappableTransformer(o.transformer)
	newPod := func() runtime.Object { return &example.Pod{} }
	newPodList := func() runtime.Object { return &example.PodList{} }
	raw, err := etcd3.New(server.V3Client, compactor, o.codec, newPod, newPodList, etcd3testing.PathPrefix(),
		"/pods/", schema.GroupResource{Resource: "pods"}, transformer, etcd3.NewDefaultLeaseManagerConfig(),
		etcd3.NewDefaultDecoder(o.codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)

	keyFunc := func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc("/pods/", obj) }
	if o.clusterScoped {
		keyFunc = func(obj runtime.Object) (string, error) { return storage.NoNamespaceKeyFunc("/pods/", obj) }
	}
	var wrapped storage.Interface = raw
	if o.wrap != nil {
		wrapped = o.wrap(raw)
	}
	cfg := Config{
		Storage:        wrapped,
		GroupResource:  schema.GroupResource{Resource: "pods"},
		ResourcePrefix: "/pods/",
		KeyFunc:        keyFunc,
		NewFunc:        newPod,
		NewListFunc:    newPodList,
		GetAttrsFunc:   podAttrs,
		Codec:          o.codec,
		Client:         server.V3Client.Client,
		StoragePrefix:  etcd3testing.PathPrefix(),
		Transformer:    transformer,
		wrapChanges:    o.changes,
	}
	if o.wrap != nil {
		// A test that wraps the store fails its reads of etcd's
		// revision there: the cache reads it through the wrapped store.
		cfg.readRevision = wrapped.GetCurrentResourceVersion
	}
	if o.indexes {
		cfg.IndexerFuncs = storage.IndexerFuncs{"spec.nodeName": func(obj runtime.Object) string {
			return obj.(*example.Pod).Spec.NodeName
		}}
		cfg.Indexers = &cache.Indexers{
			"f:spec.nodeName": func(obj interface{}) ([]string, error) {
				return []string{obj.(*example.Pod).Spec.NodeName}, nil
			},
			"f:metadata.namespace": func(obj interface{}) ([]string, error) {
				return []string{obj.(*example.Pod).Namespace}, nil
			},
		}
	}
	if o.keyReader {
		cfg.KeyReader = NewEtcdKeyReader(server.V3Client.Client, etcd3testing.PathPrefix(), "/pods/")
	}
	if o.config != nil {
		o.config(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if o.wrap == nil {
		waitReady(t, c)
	}
	return &testCacher{
		Cacher: c, client: server.V3Client.Client, transformer: transformer,
		recorder: server.V3Client.Kubernetes.(*storagetesting.KubernetesRecorder),
	}
}

func waitReady(t testing.TB, c *Cacher) {
	t.Helper()
	for {
		state, changed := c.ready.Get()
		if state == source.Ready {
			return
		}
		select {
		case <-changed:
		case <-time.After(wait.ForeverTestTimeout):
			t.Fatal("cacher never became ready")
		}
	}
}

// createWrapper waits after each Create until the cache holds the object,
// as the watch-semantics functions expect.
type createWrapper struct {
	*testCacher
}

func (c createWrapper) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	if err := c.testCacher.Create(ctx, key, obj, out, ttl); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, wait.ForeverTestTimeout, true, func(ctx context.Context) (bool, error) {
		current := &example.Pod{}
		err := c.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, current)
		if storage.IsNotFound(err) {
			return false, nil
		}
		return err == nil && apiequality.Semantic.DeepEqual(current, out), err
	})
}

// compactHistory drops the cache's events up to rv, then compacts etcd at
// rv: the cache loses history as upstream's compactWatch makes it.
func (c *testCacher) compactHistory(ctx context.Context, t *testing.T, resourceVersion string) {
	rv, err := c.cfg.Versioner.ParseResourceVersion(resourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.d.WaitFor(ctx, rv, wait.ForeverTestTimeout, c.requestProgress); err != nil {
		t.Fatal(err)
	}
	c.d.Compacted(int64(rv))
	if _, err := c.client.Compact(ctx, int64(rv)); err != nil {
		t.Fatal(err)
	}
}

// compactStore compacts etcd at rv and waits until the store observes it.
func (c *testCacher) compactStore(ctx context.Context, t *testing.T, resourceVersion string) {
	rv, err := c.cfg.Versioner.ParseResourceVersion(resourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := etcd3.Compact(ctx, c.client, 0, int64(rv)); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, wait.ForeverTestTimeout, true, func(context.Context) (bool, error) {
		return c.CompactRevision() >= int64(rv), nil
	})
	if err != nil {
		t.Fatalf("compaction at %d never observed: %v", rv, err)
	}
}

func (c *testCacher) increaseRV(ctx context.Context, t *testing.T) int64 {
	resp, err := c.client.KV.Put(ctx, "increaseRV", "ok")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func noKeyValidation(context.Context, *testing.T, string) {}

func noCallsValidation(*testing.T, uint64, uint64) {}

func TestConformanceWrites(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		run  func(t *testing.T, c *testCacher)
	}{
		{"Create", func(t *testing.T, c *testCacher) { storagetesting.RunTestCreate(ctx, t, c, noKeyValidation) }},
		{"CreateWithTTL", func(t *testing.T, c *testCacher) { storagetesting.RunTestCreateWithTTL(ctx, t, c) }},
		{"CreateWithKeyExist", func(t *testing.T, c *testCacher) { storagetesting.RunTestCreateWithKeyExist(ctx, t, c) }},
		{"UnconditionalDelete", func(t *testing.T, c *testCacher) { storagetesting.RunTestUnconditionalDelete(ctx, t, c) }},
		{"ConditionalDelete", func(t *testing.T, c *testCacher) { storagetesting.RunTestConditionalDelete(ctx, t, c) }},
		{"DeleteWithSuggestion", func(t *testing.T, c *testCacher) { storagetesting.RunTestDeleteWithSuggestion(ctx, t, c) }},
		{"DeleteWithSuggestionAndConflict", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestDeleteWithSuggestionAndConflict(ctx, t, c)
		}},
		{"DeleteWithConflict", func(t *testing.T, c *testCacher) { storagetesting.RunTestDeleteWithConflict(ctx, t, c) }},
		{"DeleteWithSuggestionOfDeletedObject", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestDeleteWithSuggestionOfDeletedObject(ctx, t, c)
		}},
		{"ValidateDeletionWithSuggestion", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestValidateDeletionWithSuggestion(ctx, t, c)
		}},
		{"ValidateDeletionWithOnlySuggestionValid", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestValidateDeletionWithOnlySuggestionValid(ctx, t, c)
		}},
		{"PreconditionalDeleteWithSuggestion", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestPreconditionalDeleteWithSuggestion(ctx, t, c)
		}},
		{"PreconditionalDeleteWithOnlySuggestionPass", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass(ctx, t, c)
		}},
		{"DeleteWithSuggestionAndMissingExpectedTransformOrDecodeError", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(ctx, t, c)
		}},
		{"GuaranteedUpdateWithTTL", func(t *testing.T, c *testCacher) { storagetesting.RunTestGuaranteedUpdateWithTTL(ctx, t, c) }},
		{"GuaranteedUpdateWithConflict", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestGuaranteedUpdateWithConflict(ctx, t, c)
		}},
		{"GuaranteedUpdateWithSuggestionAndConflict", func(t *testing.T, c *testCacher) {
			storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict(ctx, t, c)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newTestCacher(t)) })
	}
	t.Run("GuaranteedUpdate", func(t *testing.T) {
		c := newTestCacher(t, withPrefixTransformer)
		storagetesting.RunTestGuaranteedUpdate(ctx, t, c, noKeyValidation)
	})
	t.Run("GuaranteedUpdateChecksStoredData", func(t *testing.T) {
		c := newTestCacher(t, withPrefixTransformer)
		storagetesting.RunTestGuaranteedUpdateChecksStoredData(ctx, t, c)
	})
}

// failingTransformer fails reads while failing is set.
type failingTransformer struct {
	value.Transformer
	failing atomic.Bool
}

func (f *failingTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if f.failing.Load() {
		return nil, false, fmt.Errorf("synthetic transform error")
	}
	return f.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

// failingCodec fails decodes while failing is set.
type failingCodec struct {
	runtime.Codec
	failing atomic.Bool
}

func (f *failingCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if f.failing.Load() {
		return nil, nil, fmt.Errorf("synthetic decode error")
	}
	return f.Codec.Decode(data, defaults, into)
}

func TestConformanceDeleteWithBrokenData(t *testing.T) {
	ctx := context.Background()
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)
	t.Run("ConflictAndMissingExpectedTransformOrDecodeError", func(t *testing.T) {
		tr := &failingTransformer{Transformer: identity.NewEncryptCheckTransformer()}
		c := newTestCacher(t, func(o *setupOptions) { o.transformer = tr })
		storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(ctx, t, c, tr.failing.Store)
	})
	t.Run("ExpectedTransformError", func(t *testing.T) {
		tr := &failingTransformer{Transformer: identity.NewEncryptCheckTransformer()}
		c := newTestCacher(t, func(o *setupOptions) { o.transformer = tr })
		storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, c, tr.failing.Store)
	})
	t.Run("ExpectedDecodeError", func(t *testing.T) {
		// The stored bytes are deliberately undecodable here.
		etcd3.TestOnlySetFatalOnDecodeError(t, false)
		codec := &failingCodec{Codec: examplev1Blob}
		c := newTestCacher(t, withCodec(codec))
		storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, c, codec.failing.Store)
	})
}

// conformanceCase is one conformance function and the cache it runs on.
type conformanceCase struct {
	name  string
	setup []setupOption
	run   func(t *testing.T, c *testCacher)
}

func TestConformanceWatch(t *testing.T) {
	for _, tc := range watchConformance(context.Background()) {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newTestCacher(t, tc.setup...)) })
	}
	// RunTestWatchError is not run: it swaps the transformer after the
	// write, which our cache decoded at ingest. TestDecodeErrorEndsWatchers
	// checks the same promise: no silent gap.
}

// watchConformance are upstream's watch conformance functions.
func watchConformance(ctx context.Context) []conformanceCase {
	return []conformanceCase{
		{name: "Watch", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestWatch(ctx, t, c) }},
		{name: "WatchFromZero", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestWatchFromZero(ctx, t, c, c.compactHistory)
		}},
		{name: "DeleteTriggerWatch", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestDeleteTriggerWatch(ctx, t, c) }},
		{name: "WatchFromNonZero", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestWatchFromNonZero(ctx, t, c) }},
		{name: "DelayedWatchDelivery", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestDelayedWatchDelivery(ctx, t, c) }},
		{name: "WatchContextCancel", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestWatchContextCancel(ctx, t, c) }},
		{name: "WatcherTimeout", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestWatcherTimeout(ctx, t, c) }},
		{name: "WatchDeleteEventObjectHaveLatestRV", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(ctx, t, c)
		}},
		{name: "WatchInitializationSignal", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestWatchInitializationSignal(ctx, t, c)
		}},
		{name: "ClusterScopedWatch", setup: []setupOption{clusterScoped, withNodeNameIndex}, run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestClusterScopedWatch(ctx, t, c)
		}},
		{name: "NamespaceScopedWatch", setup: []setupOption{withNodeNameIndex}, run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestNamespaceScopedWatch(ctx, t, c)
		}},
		{name: "WatchDispatchBookmarkEvents", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, c, true)
		}},
		{name: "OptionalWatchBookmarksWithCorrectResourceVersion", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestOptionalWatchBookmarksWithCorrectResourceVersion(ctx, t, c)
		}},
		{name: "SendInitialEventsBackwardCompatibility", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunSendInitialEventsBackwardCompatibility(ctx, t, c)
		}},
		{name: "WatchSemantics", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunWatchSemantics(ctx, t, createWrapper{c})
		}},
		{name: "WatchSemanticInitialEventsExtended", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunWatchSemanticInitialEventsExtended(ctx, t, createWrapper{c})
		}},
		{name: "WatchListMatchSingle", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunWatchListMatchSingle(ctx, t, createWrapper{c})
		}},
	}
}

func TestConformanceReads(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
	for _, tc := range readConformance(context.Background()) {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newTestCacher(t, tc.setup...)) })
	}
	// RunTestListInconsistentContinuation is not run: its update writes an
	// object without the namespace its key has, and a cache that keys objects
	// by KeyFunc (ours, and upstream's) files it elsewhere.
	// TestListExpiredContinuation checks the same promise with a well-formed
	// update: limit honoured at "0", 410 with a fresh token, then consistent pages.
}

// readConformance are upstream's read conformance functions.
func readConformance(ctx context.Context) []conformanceCase {
	return []conformanceCase{
		{name: "Get", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestGet(ctx, t, c) }},
		{name: "List", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestList(ctx, t, c, c.compactStore, true, c.recorder)
		}},
		{name: "ConsistentList", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestConsistentList(ctx, t, c, c.increaseRV, true, true, true)
		}},
		{name: "GetListNonRecursive", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestGetListNonRecursive(ctx, t, c.increaseRV, c)
		}},
		{name: "GetListRecursivePrefix", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestGetListRecursivePrefix(ctx, t, c) }},
		{name: "ListPaging", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestListPaging(ctx, t, c) }},
		{name: "ListContinuation", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestListContinuation(ctx, t, c, noCallsValidation)
		}},
		{name: "ListPaginationRareObject", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestListPaginationRareObject(ctx, t, c, noCallsValidation)
		}},
		{name: "ListContinuationWithFilter", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestListContinuationWithFilter(ctx, t, c, noCallsValidation)
		}},
		{name: "ListResourceVersionMatch", setup: []setupOption{withPrefixTransformer}, run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestListResourceVersionMatch(ctx, t, c)
		}},
		{name: "NamespaceScopedList", setup: []setupOption{withNodeNameIndex}, run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestNamespaceScopedList(ctx, t, c)
		}},
		{name: "CompactRevision", run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestCompactRevision(ctx, t, c, c.increaseRV, c.compactStore)
		}},
		// Deliberately over JSON storage, this server's: the cache's Stats
		// estimate sizes from its own bytes instead of having etcd3 keep
		// every key's size, and are exact for JSON. Over protobuf they count
		// the resourceVersion field too (TestStatsOverProtobuf).
		{name: "Stats", setup: []setupOption{withCodec(examplev1JSON)}, run: func(t *testing.T, c *testCacher) {
			storagetesting.RunTestStats(ctx, t, c, examplev1JSON, identity.NewEncryptCheckTransformer(), true)
		}},
		{name: "KeySchema", run: func(t *testing.T, c *testCacher) { storagetesting.RunTestKeySchema(ctx, t, c) }},
	}
}

// TestConformanceCompressed runs the conformance functions that read
// objects' bytes on a cache that compresses every object a few
// milliseconds after it is written, while they read it: what each
// function checks of what it wrote holds of the bytes decompressed.
func TestConformanceCompressed(t *testing.T) {
	ctx := context.Background()
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
	compressed := map[string]bool{
		"Get": true, "List": true, "ConsistentList": true, "ListPaging": true, "ListContinuationWithFilter": true,
		"NamespaceScopedList": true, "Stats": true, "ListResourceVersionMatch": true,
		"Watch": true, "WatchFromNonZero": true, "WatchDeleteEventObjectHaveLatestRV": true,
		"SendInitialEventsBackwardCompatibility": true, "WatchSemantics": true, "WatchListMatchSingle": true,
	}
	for _, tc := range append(readConformance(ctx), watchConformance(ctx)...) {
		if !compressed[tc.name] {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newTestCacher(t, append(slices.Clip(tc.setup), withEagerCompression)...))
		})
	}
}
