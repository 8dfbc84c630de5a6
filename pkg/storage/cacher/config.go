package cacher

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/gate"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/compress"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"
)

// Defaults for Config.
const (
	// DefaultHistoryWindow is how long events stay in the log at least,
	// as upstream's watch cache keeps them.
	DefaultHistoryWindow = 75 * time.Second
	// DefaultMinHistorySize and DefaultMaxHistorySize bound the event log.
	// The maximum caps memory: at 10,000 events and a few KiB an object
	// the log holds tens of MiB.
	DefaultMinHistorySize = 128
	DefaultMaxHistorySize = 100_000
	// DefaultHistoryBudget bounds the bytes of objects each resource's
	// event log holds: the history window's worth of 1 KiB objects at
	// about 5,000 writes a second.
	DefaultHistoryBudget = 512 << 20
	// DefaultEncodingTTL is how long an object keeps the encodings made
	// to send it once it is not sent: longer than the gaps between the
	// watchers an event or watch-lists' initial states reach, with room
	// for slow ones. Watch-lists at a version other than the storage
	// version's end in about half the time with it than with encodings
	// kept only while held (docs/benchmarks.md, "What each mechanism buys").
	DefaultEncodingTTL = 10 * time.Second
	// DefaultBookmarkFrequency is how often a watcher gets a bookmark, as upstream.
	DefaultBookmarkFrequency = time.Minute
	// DefaultFreshnessTimeout bounds waits for the cache to reach a
	// resourceVersion, as upstream's 3s.
	DefaultFreshnessTimeout = 3 * time.Second
	// DefaultProgressRequestInterval is how long the cache's etcd watch may
	// hear nothing before it asks etcd for progress.
	DefaultProgressRequestInterval = 5 * time.Second
	// DefaultConsistencyCheckInterval is how often the cache compares itself
	// with etcd, as upstream's DetectCacheInconsistency: about the default
	// compaction interval, far above list latencies.
	DefaultConsistencyCheckInterval = 5 * time.Minute
	// DefaultWarmStartRevisions is how far back a warm start replays etcd's
	// history: about 75 s, the history window, at 130 writes a second.
	DefaultWarmStartRevisions = 10_000
	// DefaultWatcherBuffer is each watcher's channel size. Small, because a
	// full channel parks the watcher instead of losing events, and an idle
	// watcher's cost is mostly this buffer. 10 is what upstream's
	// conformance (RunTestDelayedWatchDelivery) expects to survive Stop;
	// it keeps an idle watcher under 1 KiB (BenchmarkIdleWatcherMemory).
	DefaultWatcherBuffer = 10
)

// ConnectionDropper closes the connections to etcd that went quiet, so that
// a re-watch after a silent watch reaches a member that answers.
type ConnectionDropper = source.ConnectionDropper

// KeyReader reads what etcd holds for the resource at a revision: keys and
// the revisions they were last modified at, never values. Lists read with
// it in pages at once, and the consistency check compares the cache with it.
type KeyReader = source.KeyReader

// EtcdKeyReader is a KeyReader over an etcd client.
type EtcdKeyReader = source.EtcdKeyReader

// NewEtcdKeyReader reads the keys the etcd3 store built with storagePrefix
// (storagebackend.Config.Prefix) keeps for resourcePrefix.
func NewEtcdKeyReader(client *clientv3.Client, storagePrefix, resourcePrefix string) *EtcdKeyReader {
	return source.NewEtcdKeyReader(client, storagePrefix, resourcePrefix)
}

// Config is what a cache needs. The first group is what a
// generic.StorageDecorator receives; the cache learns about its resource
// only through these.
type Config struct {
	// Storage is the etcd3 store the cache wraps. Writes pass through to it,
	// and the cache lists and watches it.
	Storage storage.Interface
	// GroupResource names the resource in errors and metrics.
	GroupResource schema.GroupResource
	// ResourcePrefix is the key prefix of every object of the resource.
	ResourcePrefix string
	// KeyFunc returns an object's key.
	KeyFunc func(runtime.Object) (string, error)
	// Codec is the storage's codec: it encodes an object at its storage
	// version, as the cache keeps it, and decodes that into NewFunc's type.
	Codec runtime.Codec
	// Scheme, if set, is the scheme Codec's serializer was made from. With
	// it the cache decodes its bytes in half the time (their type from
	// their header, and one pass of internal/object's
	// jsonDecoder), and StorageDecorator's etcd3 stores decode what etcd
	// holds in half the time too, each result checked by an encode.
	Scheme *runtime.Scheme
	// NewFunc returns an empty object; NewListFunc an empty list, which
	// the cache's own reads of Storage fill. StorageDecorator gives it
	// lists that keep the bytes each object was decoded from
	// (internal/object's StoredList), which need its storage codec.
	NewFunc     func() runtime.Object
	NewListFunc func() runtime.Object
	// GetAttrsFunc returns an object's labels and selectable fields.
	GetAttrsFunc storage.AttrFunc
	// IndexerFuncs are the registry's trigger functions: field name → value.
	IndexerFuncs storage.IndexerFuncs
	// Indexers index objects for lists with field or label selectors.
	Indexers *cache.Indexers

	// TriggerField is the field of IndexerFuncs that watchers are indexed
	// by, so that an event reaches only the watchers that pin its value.
	// Empty picks the only IndexerFuncs entry when there is exactly one.
	TriggerField string
	// Versioner reads and writes resourceVersions. Default: storage.APIObjectVersioner.
	Versioner storage.Versioner
	// HistoryWindow is how long events stay in the log at least, memory
	// permitting. Default DefaultHistoryWindow.
	HistoryWindow time.Duration
	// MinHistorySize and MaxHistorySize bound the event log's capacity.
	MinHistorySize, MaxHistorySize int
	// HistoryBudget bounds the estimated bytes of the object versions the
	// event log holds. Past it the oldest events leave, even inside the
	// window, and a watch from their resourceVersions gets 410. Default
	// DefaultHistoryBudget; negative is no budget.
	HistoryBudget int64
	// EncodingTTL is how long a cached object keeps an encoding made for a
	// watcher once no watcher is sent it: watchers share one encoding
	// until then, a later one encodes again. Default
	// DefaultEncodingTTL; negative keeps them while the object is current.
	EncodingTTL time.Duration
	// BookmarkFrequency is how often watchers get bookmarks. Default one minute.
	BookmarkFrequency time.Duration
	// FreshnessTimeout bounds waits for the cache to reach a resourceVersion.
	FreshnessTimeout time.Duration
	// ProgressRequestInterval is how long the cache's etcd watch may hear
	// nothing, no event and no progress notification, before it asks etcd
	// for progress: an idle resource's bookmarks then carry a
	// resourceVersion at most about this old. It is also how the cache
	// tells a silent etcd watch from an idle one: one that does not answer
	// is re-opened, since a blackholed connection may never return an
	// error (internal/source/silence.go). Readers waiting for freshness
	// ask regardless.
	ProgressRequestInterval time.Duration
	// Client is the etcd Storage writes to. The cache follows the
	// resource's changes on it, through a watch of its own: etcd sends a
	// revision's changes together, and the cache applies them together
	// (issue 56), where Storage's Watch hands them out one at a time.
	// Required; StorageDecorator sets it.
	Client *clientv3.Client
	// StoragePrefix is Storage's prefix in etcd (storagebackend.Config.Prefix).
	StoragePrefix string
	// Transformer reads the values etcd holds as Storage does (encryption
	// at rest); nil reads them as they are.
	Transformer value.Transformer
	// KeyReader reads etcd's keys and revisions for the consistency check;
	// nil turns the check off. StorageDecorator sets one.
	KeyReader KeyReader
	// Connections, when set, closes the connections to etcd that went
	// quiet when the cache's etcd watch does, before it is re-opened: on
	// the same connection it would stay silent until gRPC's keepalive
	// gives up. StorageDecorator sets one for each resource, holding the
	// connections of that resource's etcd clients only.
	Connections ConnectionDropper
	// ConsistencyCheckInterval is how often the cache compares itself with
	// etcd, each wait jittered up to 1.5×. Negative turns the check off.
	ConsistencyCheckInterval time.Duration
	// ConsistentReadFallback serves reads from etcd when the cache is not
	// ready or too slow to catch up, instead of answering 429. Off by
	// default: under load the fallback cascades into etcd (kubernetes#138494).
	ConsistentReadFallback bool
	// WarmStartRevisions is how many etcd revisions back the first list,
	// and a re-list after compaction, reach to fill the event log from
	// etcd's history; see warm_start.go. Negative starts cold, with an
	// empty log. Default DefaultWarmStartRevisions.
	WarmStartRevisions int64
	// Shutdown, when it begins, bookmarks every watcher before the server
	// ends them; see Shutdown. Nil: never.
	Shutdown *Shutdown
	// Initialized, if set, tells when the cache has been ready once: a
	// server's /readyz check; see Initialized.
	Initialized *Initialized
	// WatcherBuffer is the size of each watcher's channel.
	WatcherBuffer int
	// InitialEvents bounds how many watchers stream initial events at once,
	// across the caches that share it; see gate.InitialEvents. Nil: no bound.
	InitialEvents *gate.InitialEvents
	// Clock drives bookmarks and waits. Default: the real clock.
	Clock clock.WithTicker
	// Compression is how the cache keeps its objects at rest:
	// CompressionOff (the default) as their JSON, or CompressionS2, each
	// object compressed on its own with S2 against a dictionary trained
	// from the resource's objects, once the version is older than
	// HistoryWindow. See Compression.
	Compression Compression

	// compressEvery is the time between the packer's passes, negative for
	// none: tests run them (Cacher.packer.Pass). Default
	// packer.DefaultInterval. compressWindow is how long a version stays
	// as it is, negative for not at all: tests compress every object at
	// once. Default HistoryWindow.
	compressEvery, compressWindow time.Duration

	// wrapChanges, if set, wraps the etcd changes the cache follows: tests
	// inject faults with it.
	wrapChanges func(source.Changes) source.Changes
	// wrapRanges, if set, wraps what reads the pages of the cache's own
	// lists after the first: tests observe and fail those reads with it.
	wrapRanges func(source.RangeReader) source.RangeReader
	// readRevision reads etcd's current revision. Default: through
	// Client (source.EtcdRevision); tests that fail Storage's reads of
	// it read it there.
	readRevision func(context.Context) (uint64, error)

	// listPageSize is the page size of the cache's own lists from the
	// store, and listPageBytes the bytes of a page read at once; tests
	// make them small. Defaults source.ListPageSize and
	// source.ListPageBytes.
	listPageSize, listPageBytes int64
}

func (c *Config) complete() error {
	switch {
	case c.Storage == nil:
		return fmt.Errorf("cacher: Config.Storage is required")
	case c.KeyFunc == nil || c.NewFunc == nil || c.NewListFunc == nil || c.GetAttrsFunc == nil || c.Codec == nil:
		return fmt.Errorf("cacher: Config.KeyFunc, NewFunc, NewListFunc, GetAttrsFunc and Codec are required")
	case c.Client == nil:
		return fmt.Errorf("cacher: Config.Client, the etcd client the cache follows the resource's changes with, is required")
	}
	if c.readRevision == nil {
		c.readRevision = source.NewEtcdRevision(c.Client, c.StoragePrefix, c.ResourcePrefix, c.GroupResource).Current
	}
	if c.Versioner == nil {
		c.Versioner = storage.APIObjectVersioner{}
	}
	if c.TriggerField == "" && len(c.IndexerFuncs) == 1 {
		for field := range c.IndexerFuncs {
			c.TriggerField = field
		}
	}
	if c.TriggerField != "" && c.IndexerFuncs[c.TriggerField] == nil {
		return fmt.Errorf("cacher: trigger field %q has no IndexerFunc", c.TriggerField)
	}
	setDefault(&c.HistoryWindow, DefaultHistoryWindow)
	setDefault(&c.MinHistorySize, DefaultMinHistorySize)
	setDefault(&c.MaxHistorySize, DefaultMaxHistorySize)
	setDefault(&c.HistoryBudget, DefaultHistoryBudget)
	setDefault(&c.EncodingTTL, DefaultEncodingTTL)
	setDefault(&c.BookmarkFrequency, DefaultBookmarkFrequency)
	setDefault(&c.FreshnessTimeout, DefaultFreshnessTimeout)
	setDefault(&c.ProgressRequestInterval, DefaultProgressRequestInterval)
	setDefault(&c.WatcherBuffer, DefaultWatcherBuffer)
	setDefault(&c.ConsistencyCheckInterval, DefaultConsistencyCheckInterval)
	setDefault(&c.WarmStartRevisions, DefaultWarmStartRevisions)
	setDefault(&c.listPageSize, source.ListPageSize)
	setDefault(&c.listPageBytes, source.ListPageBytes)
	switch c.Compression {
	case "":
		c.Compression = CompressionOff
	case CompressionOff, CompressionS2:
	default:
		return fmt.Errorf("cacher: Config.Compression must be %q or %q, not %q", CompressionOff, CompressionS2, c.Compression)
	}
	if c.MaxHistorySize < c.MinHistorySize {
		c.MaxHistorySize = c.MinHistorySize
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// builderConfig is what the cache's Builder needs of c, the cache's
// Expiry, and with compression its codec and what it is told of corrupt
// objects.
func (c *Config) builderConfig(x *object.Expiry, cc *compress.Codec, corrupt func(*object.Object, error)) object.BuilderConfig {
	return object.BuilderConfig{Codec: c.Codec, Scheme: c.Scheme, NewFunc: c.NewFunc, KeyFunc: c.KeyFunc,
		GetAttrsFunc: c.GetAttrsFunc, Versioner: c.Versioner, TriggerField: c.TriggerField,
		IndexerFuncs: c.IndexerFuncs, Indexers: c.Indexers, Expiry: x, Compression: cc, Corrupt: corrupt}
}

// changes is etcd's record of the resource's changes, read as Storage
// reads it. held, if set, returns the cache's object of the version a change puts,
// if the cache holds it. With corrupt, the changes end in a re-list once
// it found a corrupt object (corruption).
func (c *Config) changes(held func(key string, rev uint64) *object.Object, corrupt *corruption) source.Changes {
	var ch source.Changes = source.NewEtcdChanges(source.EtcdChangesConfig{EtcdReadConfig: c.etcdRead(), Held: held})
	if c.wrapChanges != nil {
		ch = c.wrapChanges(ch)
	}
	if corrupt != nil {
		corrupt.changes = ch
		ch = corrupt
	}
	return ch
}

// etcdRead is how the cache reads etcd itself: its client, where the
// resource's keys are, and their values read as Storage reads them.
func (c *Config) etcdRead() source.EtcdReadConfig {
	return source.EtcdReadConfig{Client: c.Client, StoragePrefix: c.StoragePrefix, ResourcePrefix: c.ResourcePrefix,
		Transformer: c.Transformer, Decode: c.decoder(), GroupResource: c.GroupResource}
}

// ranges reads the pages of the cache's own lists after the first from
// etcd, each over its own keys, with values read as Storage reads them.
func (c *Config) ranges() source.RangeReader {
	var r source.RangeReader = source.NewEtcdRanges(c.etcdRead())
	if c.wrapRanges != nil {
		r = c.wrapRanges(r)
	}
	return r
}

// decoder decodes a value etcd holds at a revision, as Storage's watch
// does. With a Scheme it keeps the bytes with the object (object.StoredItem)
// when they are what Codec writes for it, so that the object's cached bytes
// are written from them and not encoded again, as the cache's lists do.
func (c *Config) decoder() func([]byte, uint64) (runtime.Object, error) {
	codec := c.Codec
	stored := c.Scheme != nil
	if stored {
		codec = object.NewStorageCodec(c.Codec, c.Scheme, c.NewFunc)
	}
	return func(data []byte, rev uint64) (runtime.Object, error) {
		var into runtime.Object
		if stored {
			into = &object.StoredItem{}
		}
		obj, _, err := codec.Decode(data, nil, into)
		if err != nil {
			return nil, err
		}
		if err := c.Versioner.UpdateObject(obj, rev); err != nil {
			return nil, err
		}
		return obj, nil
	}
}
