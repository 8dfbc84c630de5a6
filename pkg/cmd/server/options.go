// Package server holds the cached-apiserver command: its options and the
// Complete → Validate → Config → Run steps.
package server

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	genericfeatures "k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/registry/generic"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	netutils "k8s.io/utils/net"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/apiserver"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

// The modes the server runs in.
const (
	// ModeStandalone needs no kube-apiserver: it issues its own certificates
	// and authorizes client certificates in system:masters.
	ModeStandalone = "standalone"
	// ModeAggregated runs behind the kube-aggregator with delegated
	// authentication and authorization, as sample-apiserver does.
	ModeAggregated = "aggregated"
)

const (
	// etcdPathPrefix is where objects live in etcd; the storage factory
	// appends <group>/<resource>, so keys read /registry/fleet.example.com/
	// assignments/<namespace>/<name>, as CustomResources' do.
	etcdPathPrefix   = "/registry"
	defaultDataDir   = ".cached-apiserver"
	defaultPort      = 8443
	kubeconfigName   = "kubeconfig"
	standaloneBindIP = "127.0.0.1"
	// defaultWatchTerminationGrace is how long open watches get to end on
	// shutdown: long enough to spread thousands of clients' reconnects.
	defaultWatchTerminationGrace = 5 * time.Second
	// shutdownBookmarkWait bounds how long shutdown waits for watchers to
	// take the bookmark the caches send them.
	shutdownBookmarkWait = time.Second
)

// Options is everything the command line sets.
type Options struct {
	// Recommended are the generic apiserver options (etcd, serving, delegated auth, admission…).
	Recommended *genericoptions.RecommendedOptions
	// ServerRun are limits and shutdown behaviour: max-in-flight, request size, watch termination grace.
	ServerRun *genericoptions.ServerRunOptions
	// EmbeddedEtcd configures the etcd started when --etcd-servers is empty.
	EmbeddedEtcd *EmbeddedEtcdOptions
	// Mode is ModeStandalone or ModeAggregated.
	Mode string
	// DataDir holds the embedded etcd's data, and in standalone mode the certificates and kubeconfig.
	DataDir string
	// ConsistentReadFallback lets reads go to etcd when the watch cache is
	// not ready or too far behind; --watch-cache (from the etcd options)
	// turns the cache itself on or off.
	ConsistentReadFallback bool
	// ConsistencyCheckInterval is how often each resource's watch cache
	// compares itself with etcd; 0 turns the check off.
	ConsistencyCheckInterval time.Duration
	// WarmStartRevisions is how far back, in etcd revisions, each watch
	// cache fills its history from etcd when it starts; 0 starts empty.
	WarmStartRevisions int64
	// HistoryBudget bounds the bytes of objects each resource's watch
	// cache history holds; 0 is no budget.
	HistoryBudget resource.QuantityValue
	// InitialEventsConcurrency bounds how many watches stream their initial
	// events at once; 0 is no bound.
	InitialEventsConcurrency int
	// Compression is how each resource's watch cache keeps its objects at
	// rest: "off" or "s2" (cacher.Compression).
	Compression string
	// MaxWatches caps the watch requests served at once; past it a new
	// watch gets 429 with Retry-After. 0 is no cap.
	MaxWatches int

	// Out receives the startup banner.
	Out io.Writer

	// shutdown begins in a pre-shutdown hook, so that the watch caches
	// bookmark their watchers before the server ends them.
	shutdown *cacher.Shutdown
	// initialized holds /readyz until every watch cache has listed once,
	// whatever --storage-initialization-timeout says.
	initialized *cacher.Initialized

	// WatchesOffChainStack turns on the generic server's
	// APIServingWithRoutine unless --feature-gates names it: a watch is then
	// served from a goroutine whose stack holds the outermost filters only,
	// the handler chain's own having returned, which takes RSS per stream
	// from 46 to 31 KiB (issue 57, docs/benchmarks.md). The benchmark's
	// upstream wiring clears it, to keep the generic server's defaults.
	WatchesOffChainStack bool

	// StorageDecoratorOverride, when set, replaces the storage decorator
	// that --watch-cache chooses. No flag sets it: it exists so that the
	// benchmark in test/bench can run this same server over upstream's
	// Cacher for comparison. The shipped binary never sets it.
	StorageDecoratorOverride generic.StorageDecorator

	flags *pflag.FlagSet
}

// NewOptions returns the defaults.
func NewOptions(out io.Writer) *Options {
	o := &Options{
		Recommended: genericoptions.NewRecommendedOptions(etcdPathPrefix,
			apiserver.Codecs.LegacyCodec(v1beta1.SchemeGroupVersion)),
		ServerRun:    genericoptions.NewServerRunOptions(),
		EmbeddedEtcd: NewEmbeddedEtcdOptions(),
		Mode:         ModeStandalone,
		DataDir:      defaultDataDir,
		Out:          out,

		ConsistencyCheckInterval: cacher.DefaultConsistencyCheckInterval,
		WarmStartRevisions:       cacher.DefaultWarmStartRevisions,
		MaxWatches:               apiserver.DefaultMaxWatches,
		InitialEventsConcurrency: defaultInitialEventsConcurrency(),
		HistoryBudget:            resource.QuantityValue{Quantity: *resource.NewQuantity(cacher.DefaultHistoryBudget, resource.BinarySI)},
		Compression:              string(cacher.CompressionOff),
		WatchesOffChainStack:     true,
	}
	o.Recommended.Etcd.StorageConfig.EncodeVersioner = runtime.NewMultiGroupVersioner(
		v1beta1.SchemeGroupVersion, schema.GroupKind{Group: fleet.GroupName})
	o.Recommended.SecureServing.BindPort = defaultPort
	// The server has nothing to offer without its HTTPS port: 0 is an
	// error, not "serve nothing".
	o.Recommended.SecureServing.Required = true
	// With a positive grace period the generic server ends open watches on
	// shutdown, spread over the period; with upstream's default of 0 it
	// leaves them open and shutdown waits out its 60 s timeout.
	o.ServerRun.ShutdownWatchTerminationGracePeriod = defaultWatchTerminationGrace
	// A client whose watch shutdown ended re-watches at once, often on the
	// same connection to this server (the kube-aggregator keeps one). With
	// upstream's default a request then gets 503, which client-go's
	// reflector answers with a re-list; with this it gets 429 and
	// Retry-After, which the reflector retries from its resourceVersion, and
	// the listener stays open until requests in flight are done, then sends
	// GOAWAY, so the retry goes to another replica
	// (TestAggregatedReplicaLoss/stopped: its trace showed the 503).
	o.ServerRun.ShutdownSendRetryAfter = true
	return o
}

// AddFlags registers every flag on fs and returns them by section, for
// --help.
func (o *Options) AddFlags(fs *pflag.FlagSet) cliflag.NamedFlagSets {
	o.flags = fs
	var fss cliflag.NamedFlagSets
	main := fss.FlagSet("cached-apiserver")
	main.StringVar(&o.Mode, "mode", o.Mode, "standalone: no kube-apiserver needed; own certificates, client-certificate "+
		"authentication, system:masters authorized. aggregated: behind the kube-aggregator with delegated "+
		"authentication and authorization.")
	main.StringVar(&o.DataDir, "data-dir", o.DataDir, "Directory for the embedded etcd's data and, in standalone mode, "+
		"the certificates and the kubeconfig.")
	main.IntVar(&o.MaxWatches, "max-watches", o.MaxWatches,
		"The most watch requests (watch-lists included) this server serves at once. Past it a new watch gets "+
			"429 Too Many Requests with Retry-After; open watches are untouched. An open watch costs the server "+
			"30 to 55 KiB when clients share HTTP/2 connections (as behind the kube-aggregator) and about 100 KiB "+
			"with a connection each (docs/operations.md, Sizing). 0 is no limit.")

	wc := fss.FlagSet("watch cache")
	wc.BoolVar(&o.ConsistentReadFallback, "watch-cache-consistent-read-fallback", o.ConsistentReadFallback,
		"Serve reads from etcd while the watch cache is initializing or cannot catch up within 3s, instead of "+
			"answering 429 Too Many Requests. Off by default: under load the fallback moves the whole read load onto etcd.")
	wc.DurationVar(&o.ConsistencyCheckInterval, "watch-cache-consistency-check-interval", o.ConsistencyCheckInterval,
		"How often each resource's watch cache compares its keys and resourceVersions with etcd's, read keys-only, "+
			"and re-lists when they differ (each wait jittered up to 1.5x), so that a cache that missed or misapplied "+
			"an event repairs itself instead of serving the difference until a restart. 0 turns the check off.")
	wc.Int64Var(&o.WarmStartRevisions, "watch-cache-warm-start-revisions", o.WarmStartRevisions,
		"How many etcd revisions back each watch cache reaches when it starts, to fill its history from etcd's, so "+
			"that clients resuming from a resourceVersion older than the start get events instead of 410. etcd's "+
			"compaction bounds it too, and so do the history's size and budget (--watch-cache-history-budget): a start "+
			"holds the newest revisions they take, and promises no older one. 0 starts with an empty history, as "+
			"upstream's cache does.")
	wc.IntVar(&o.InitialEventsConcurrency, "watch-cache-initial-events-concurrency", o.InitialEventsConcurrency,
		"How many watches stream their initial events at once (watch-lists, and watches from resourceVersion 0), "+
			"across every resource. The others wait their turn, first come first served. While others wait, a watch "+
			"keeps its turn for at most 5s, and gives it up when its client takes no event for 100ms, until the "+
			"client reads again. Priority and fairness counts requests, not cores: behind kube-apiserver, lists "+
			"beside 100 watch-lists ended about 10 times as soon with the default, twice the CPUs this process may "+
			"use, as with no bound, and the watch-lists as soon; in standalone mode it halves the writes' p99 beside "+
			"them. 0 is no bound.")
	wc.Var(&o.HistoryBudget, "watch-cache-history-budget",
		"The most memory, estimated, that each resource's watch cache history may hold in object versions, as a "+
			"quantity (512Mi). Past it the oldest events leave even inside the history window, and a watch from their "+
			"resourceVersions gets 410 Gone. It bounds what a resource of large objects written fast may hold within "+
			"the 75s window. 0 is no budget.")
	wc.StringVar(&o.Compression, "watch-cache-compression", o.Compression,
		"How each resource's watch cache keeps its objects in memory: off, as their JSON; or s2, each object "+
			"compressed on its own with S2 against a dictionary trained from about 1,000 of the resource's objects, once "+
			"it is older than the 75s history window (about a quarter of the JSON on objects like a real cluster's; "+
			"decompressed in about 1us whenever read, into the response). The cache retrains in the background when "+
			"its objects compress worse, and lists again if a compressed object fails its checksum. Sizes, budgets "+
			"and metrics count uncompressed bytes: nothing shows a compressed size. zstd is not offered: it "+
			"decompresses an object in 3.5-4us, over the 2us a read may spend, for records a fifth smaller.")

	o.Recommended.Etcd.AddFlags(fss.FlagSet("etcd"))
	o.EmbeddedEtcd.AddFlags(fss.FlagSet("embedded etcd"))
	o.Recommended.SecureServing.AddFlags(fss.FlagSet("secure serving"))
	o.Recommended.Authentication.AddFlags(fss.FlagSet("authentication"))
	o.Recommended.Authorization.AddFlags(fss.FlagSet("authorization"))
	o.Recommended.Audit.AddFlags(fss.FlagSet("auditing"))
	o.Recommended.Features.AddFlags(fss.FlagSet("features"))
	o.Recommended.CoreAPI.AddFlags(fss.FlagSet("kube-apiserver connection"))
	o.Recommended.Admission.AddFlags(fss.FlagSet("admission"))
	o.Recommended.EgressSelector.AddFlags(fss.FlagSet("egress selector"))
	o.Recommended.Traces.AddFlags(fss.FlagSet("traces"))
	o.ServerRun.AddUniversalFlags(fss.FlagSet("limits and shutdown"))
	for _, name := range fss.Order {
		fs.AddFlagSet(fss.FlagSets[name])
	}
	return fss
}

// Complete fills in what depends on other options.
func (o *Options) Complete() error {
	if err := o.ServerRun.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	if err := o.serveWatchesOffChainStack(); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return err
	}
	o.DataDir = dir
	if o.Mode != ModeStandalone {
		return o.ServerRun.Complete()
	}
	// Standalone mode serves developers on this machine only, unless told otherwise.
	if o.flags == nil || !o.flags.Changed("bind-address") {
		o.Recommended.SecureServing.BindAddress = netutils.ParseIPSloppy(standaloneBindIP)
	}
	// These need a kube-apiserver, which standalone mode does not have.
	// Max-in-flight limits (ServerRun) stay on in their place.
	o.Recommended.Authentication = nil
	o.Recommended.Authorization = nil
	o.Recommended.CoreAPI = nil
	o.Recommended.Admission = nil
	o.Recommended.Features.EnablePriorityAndFairness = false
	return o.ServerRun.Complete()
}

// serveWatchesOffChainStack turns APIServingWithRoutine on when
// WatchesOffChainStack asks for it and --feature-gates does not name it.
func (o *Options) serveWatchesOffChainStack() error {
	gate := string(genericfeatures.APIServingWithRoutine)
	if !o.WatchesOffChainStack {
		return nil
	}
	if o.flags != nil {
		if f := o.flags.Lookup("feature-gates"); f != nil && strings.Contains(f.Value.String(), gate) {
			return nil
		}
	}
	return utilfeature.DefaultMutableFeatureGate.Set(gate + "=true")
}

// Validate checks the options.
func (o *Options) Validate() error {
	var errs []error
	if o.Mode != ModeStandalone && o.Mode != ModeAggregated {
		errs = append(errs, fmt.Errorf("--mode must be %q or %q, not %q", ModeStandalone, ModeAggregated, o.Mode))
	}
	if o.embedded() {
		// The embedded etcd's endpoint is known only once it runs; validate
		// the rest of the etcd options against a stand-in.
		o.Recommended.Etcd.StorageConfig.Transport.ServerList = []string{"http://127.0.0.1:2379"}
		defer func() { o.Recommended.Etcd.StorageConfig.Transport.ServerList = nil }()
	}
	errs = append(errs, o.Recommended.Validate()...)
	if _, err := genericoptions.ParseWatchCacheSizes(o.Recommended.Etcd.WatchCacheSizes); err != nil {
		errs = append(errs, fmt.Errorf("--watch-cache-sizes: %w (want resource.group#size, e.g. assignments.fleet.example.com#0)", err))
	}
	if o.ConsistencyCheckInterval < 0 {
		errs = append(errs, fmt.Errorf("--watch-cache-consistency-check-interval must be 0 (off) or positive, not %v", o.ConsistencyCheckInterval))
	}
	if o.HistoryBudget.Sign() < 0 {
		errs = append(errs, fmt.Errorf("--watch-cache-history-budget must be 0 (no budget) or positive, not %s", o.HistoryBudget.String()))
	}
	if o.InitialEventsConcurrency < 0 {
		errs = append(errs, fmt.Errorf("--watch-cache-initial-events-concurrency must be 0 (no bound) or positive, not %d", o.InitialEventsConcurrency))
	}
	if o.MaxWatches < 0 {
		errs = append(errs, fmt.Errorf("--max-watches must be 0 (no limit) or positive, not %d", o.MaxWatches))
	}
	if !slices.Contains(cacher.Compressions, cacher.Compression(o.Compression)) {
		errs = append(errs, fmt.Errorf("--watch-cache-compression must be %q or %q, not %q (zstd is not offered: it decompresses too slowly)",
			cacher.CompressionOff, cacher.CompressionS2, o.Compression))
	}
	if o.WarmStartRevisions < 0 {
		errs = append(errs, fmt.Errorf("--watch-cache-warm-start-revisions must be 0 (off) or positive, not %d", o.WarmStartRevisions))
	}
	errs = append(errs, o.ServerRun.Validate()...)
	errs = append(errs, o.EmbeddedEtcd.Validate()...)
	return utilerrors.NewAggregate(errs)
}
