package cacher

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/packer"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// Cacher is a storage.Interface that serves reads and watches from memory
// and passes writes to the store it wraps. It keeps one watch on that store,
// however many clients watch.
type Cacher struct {
	cfg     Config
	metrics *cacheMetrics
	store   *fanout.Store
	log     *fanout.Log
	d       *fanout.Dispatcher
	ready   *source.Readiness
	// pres makes objects' fields and Cachings; expiry forgets the latter
	// once Config.EncodingTTL passes without a send (nil: never).
	pres   *fanout.Presenter
	expiry *object.Expiry
	// build makes the objects the cache holds.
	build *object.Builder

	// src lists etcd and follows its changes; requests through the cache
	// that etcd answered tell it etcd is back.
	src *source.Source

	// packer compresses the objects at rest, and corrupt makes the cache
	// list again when one does not decompress; nil without compression
	// (compression.go).
	packer  *packer.Packer
	corrupt *corruption

	stop context.CancelFunc
	// done is closed when the source has stopped.
	done chan struct{}
}

var _ storage.Interface = &Cacher{}

// New starts a cache over cfg.Storage. It becomes ready once its first list
// completes; until then reads and watches get 429.
//
//	c, err := cacher.New(cacher.Config{
//		Storage: etcdStore, ResourcePrefix: "/assignments",
//		KeyFunc: keyFunc, NewFunc: newFunc, NewListFunc: newListFunc,
//		GetAttrsFunc: getAttrs,
//	})
//	defer c.Stop()
func New(cfg Config) (*Cacher, error) {
	if err := cfg.complete(); err != nil {
		return nil, err
	}
	c := &Cacher{cfg: cfg, metrics: newCacheMetrics(cfg.GroupResource), done: make(chan struct{})}
	c.ready = source.NewReadiness(c.metrics.unready)
	if cfg.EncodingTTL > 0 {
		c.expiry = object.NewExpiry(cfg.EncodingTTL, cfg.Clock)
	}
	cc, err := c.newCompression()
	if err != nil {
		return nil, err
	}
	var corrupted func(*object.Object, error)
	if cc != nil {
		corrupted = c.corrupted
	}
	c.build = object.NewBuilder(cfg.builderConfig(c.expiry, cc, corrupted))
	c.store = store.New[*fanout.Event](c.build.IndexFuncs())
	c.pres = fanout.NewPresenter(cfg.TriggerField, c.build.Codec(), c.expiry)
	c.log = history.New[*fanout.Event](history.Config{Window: cfg.HistoryWindow, MinSize: cfg.MinHistorySize, MaxSize: cfg.MaxHistorySize, Budget: cfg.HistoryBudget})
	c.d = fanout.NewDispatcher(fanout.Config{Store: c.store, Log: c.log, Presenter: c.pres, Versioner: cfg.Versioner,
		NewFunc: cfg.NewFunc, Clock: cfg.Clock, BookmarkFrequency: cfg.BookmarkFrequency, Gate: cfg.InitialEvents,
		Metrics: c.metrics.Metrics})
	c.src = source.New(source.Config{Store: revisionStore{Store: cfg.Storage, read: cfg.readRevision}, Changes: cfg.changes(c.heldVersion, c.corrupt), ResourcePrefix: cfg.ResourcePrefix,
		GroupResource: cfg.GroupResource, NewListFunc: cfg.NewListFunc, Versioner: cfg.Versioner, Build: c.build,
		Keys: cfg.KeyReader, Ranges: cfg.ranges(), ListPageSize: cfg.listPageSize, ListPageBytes: cfg.listPageBytes,
		WarmStartRevisions: cfg.WarmStartRevisions, ConsistencyCheckInterval: cfg.ConsistencyCheckInterval,
		BackfillEvents: cfg.MaxHistorySize, BackfillBytes: max(cfg.HistoryBudget, 0),
		FreshnessTimeout: cfg.FreshnessTimeout, ProgressRequestInterval: cfg.ProgressRequestInterval,
		Connections: cfg.Connections, Clock: cfg.Clock,
		Sink: c.d, Objects: c.store, History: c.log, Ready: c.ready, Metrics: c.metrics.source})
	cfg.Shutdown.Register(c.d)
	if !cfg.ConsistentReadFallback {
		// With the fallback, reads go to etcd until the cache is ready,
		// as upstream's: the readiness hook's timeout is enough.
		cfg.Initialized.register(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	go func() {
		defer close(c.done)
		c.src.Run(ctx)
	}()
	go c.tick(ctx)
	c.startPacker(ctx, cc)
	addLive(c)
	return c, nil
}

// Stop ends the ingest loop and every watcher. It is safe to call twice.
func (c *Cacher) Stop() {
	removeLive(c)
	c.cfg.Shutdown.Unregister(c.d)
	c.cfg.Initialized.unregister(c)
	c.stop()
	<-c.done
	c.ready.Set(source.Stopped)
	c.d.Close()
}

// heldVersion returns the store's object for key if it is the version at
// rev (source.EtcdChangesConfig.Held).
func (c *Cacher) heldVersion(key string, rev uint64) *object.Object {
	if o, ok := c.store.Get(key); ok && o.RV == rev {
		return o
	}
	return nil
}

// Floor is the oldest resourceVersion a watch can resume from without a
// 410: the later of etcd's compaction, as the store knows it, and the
// oldest the cache promises to hold (source.Promised): its history, which
// the window and the byte budget trim, or, while a warm start's backfill
// runs, where it fills from. A watch from below it gets 410; from it or
// above, its events. The floor_resource_version metric reports it, so
// that a checker reads the promise rather than guess it.
func (c *Cacher) Floor() uint64 {
	return max(uint64(max(c.cfg.Storage.CompactRevision(), 0)), c.src.Promised())
}

// waitConsistent waits until the cache holds etcd's current revision. When
// etcd cannot tell its revision in FreshnessTimeout, as while the member has
// no leader, the read fails with 503 rather than serve what may be stale.
func (c *Cacher) waitConsistent(ctx context.Context) error {
	revCtx, cancel := context.WithTimeout(ctx, c.cfg.FreshnessTimeout)
	rv, err := c.cfg.readRevision(revCtx)
	cancel()
	c.src.Answered(err)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.noCurrentRevision(err)
	}
	if err := c.d.WaitFor(ctx, rv, c.cfg.FreshnessTimeout, c.requestProgress); err != nil {
		if storage.IsTooLargeResourceVersion(err) {
			return apierrors.NewTooManyRequests(fmt.Sprintf(
				"the watch cache for %s is not yet at the current resourceVersion %d; retry shortly",
				c.cfg.GroupResource, rv), 1)
		}
		return err
	}
	return nil
}

// revisionStore is the store the source lists from, with etcd's revision
// read as the cache's consistent reads read it: through the cache's own
// client, the one its watch follows etcd with (source.EtcdRevision), so
// that the silence check does not wait on the store's reconnection.
type revisionStore struct {
	source.Store
	read func(context.Context) (uint64, error)
}

func (s revisionStore) GetCurrentResourceVersion(ctx context.Context) (uint64, error) {
	return s.read(ctx)
}

// noCurrentRevision is the error of a consistent read while etcd cannot
// give its current revision: 503 with Retry-After, and what to do instead.
func (c *Cacher) noCurrentRevision(err error) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure,
		Code:   http.StatusServiceUnavailable,
		Reason: metav1.StatusReasonServiceUnavailable,
		Message: fmt.Sprintf("cannot serve a consistent read of %s: etcd did not tell its current revision (%v). "+
			"Retry shortly, or read with resourceVersion=0 to accept the watch cache's possibly stale state", c.what(), err),
		Details: &metav1.StatusDetails{Group: c.cfg.GroupResource.Group, Kind: c.cfg.GroupResource.Resource, RetryAfterSeconds: 1},
	}}
}

// what names the resource in errors.
func (c *Cacher) what() string { return c.cfg.GroupResource.String() }

func (c *Cacher) parseRV(rv string) (uint64, error) {
	if rv == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("invalid resourceVersion %q: it must be a non-negative integer", rv))
	}
	return n, nil
}

// Versioner implements storage.Interface.
func (c *Cacher) Versioner() storage.Versioner { return c.cfg.Storage.Versioner() }

// Create implements storage.Interface.
func (c *Cacher) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	return c.src.Answered(c.cfg.Storage.Create(ctx, key, obj, out, ttl))
}

// Delete implements storage.Interface, offering the cached object as the
// suggestion. etcd3 retries with a fresh read if it is stale.
func (c *Cacher) Delete(ctx context.Context, key string, out runtime.Object, preconditions *storage.Preconditions,
	validateDeletion storage.ValidateObjectFunc, cachedExistingObject runtime.Object, opts storage.DeleteOptions) error {
	if cachedExistingObject == nil {
		cachedExistingObject = c.suggestion(key)
	}
	return c.src.Answered(c.cfg.Storage.Delete(ctx, key, out, preconditions, validateDeletion, cachedExistingObject, opts))
}

// GuaranteedUpdate implements storage.Interface, offering the cached object
// as the suggestion. The copy is deep: tryUpdate may mutate it.
func (c *Cacher) GuaranteedUpdate(ctx context.Context, key string, destination runtime.Object, ignoreNotFound bool,
	preconditions *storage.Preconditions, tryUpdate storage.UpdateFunc, cachedExistingObject runtime.Object) error {
	if cachedExistingObject == nil {
		cachedExistingObject = c.suggestion(key)
	}
	return c.src.Answered(c.cfg.Storage.GuaranteedUpdate(ctx, key, destination, ignoreNotFound, preconditions, tryUpdate, cachedExistingObject))
}

func (c *Cacher) suggestion(key string) runtime.Object {
	if s, _ := c.ready.Get(); s != source.Ready {
		return nil
	}
	if o, ok := c.store.Get(key); ok {
		// A cached object decodes; if it could not, etcd3 reads it.
		return o.DeepCopyObject()
	}
	return nil
}

// Stats implements storage.Interface: the number of objects once the cache
// is as fresh as etcd, and their average size in etcd, from what the cache
// holds. Upstream's Cacher has etcd3 keep every key and its value's size
// beside the cache (EnableResourceSizeEstimation), about 110 bytes an
// object; the cache knows both already. Deliberately, the size is given
// whether or not the SizeBasedListCostEstimate feature is on: priority and
// fairness uses it only when it is.
func (c *Cacher) Stats(ctx context.Context) (storage.Stats, error) {
	if err := c.waitConsistent(ctx); err != nil {
		return storage.Stats{}, err
	}
	n := c.store.Counts()
	st := storage.Stats{ObjectCount: int64(n.Objects)}
	if n.Objects > 0 {
		st.EstimatedAverageObjectSizeBytes = n.Stored / int64(n.Objects)
	}
	return st, nil
}

// ReadinessCheck implements storage.Interface.
func (c *Cacher) ReadinessCheck() error { return c.ready.Check(c.what()) }

// RequestWatchProgress implements storage.Interface: the cache's etcd watch
// asks for a progress notification. The caller's context cannot name the
// watch's stream, which is the watch's own.
func (c *Cacher) RequestWatchProgress(context.Context) error {
	c.requestProgress()
	return nil
}

// GetCurrentResourceVersion implements storage.Interface: etcd's current
// revision, read as a consistent read reads it, through the cache's own
// etcd client (Config.readRevision).
func (c *Cacher) GetCurrentResourceVersion(ctx context.Context) (uint64, error) {
	return c.cfg.readRevision(ctx)
}

// EnableResourceSizeEstimation implements storage.Interface. It does
// nothing: Stats estimates sizes from the cache.
func (c *Cacher) EnableResourceSizeEstimation(storage.KeysFunc) error { return nil }

// CompactRevision implements storage.Interface.
func (c *Cacher) CompactRevision() int64 { return c.cfg.Storage.CompactRevision() }
