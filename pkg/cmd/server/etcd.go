package server

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/internal/embedetcd"
)

// EmbeddedEtcdOptions configures the etcd the server starts when no
// --etcd-servers are given.
type EmbeddedEtcdOptions struct {
	// ClientPort is the loopback port etcd serves clients on; 0 picks a free one.
	ClientPort int
	// QuotaBackendBytes is etcd's backend size quota. When the database
	// reaches it, etcd raises a NOSPACE alarm and refuses writes until it is
	// compacted and defragmented. 2 GiB is etcd's own default and fits a
	// developer machine; a production cluster should run external etcd.
	QuotaBackendBytes int64
	// ProgressNotifyInterval is how often etcd tells idle watches its current
	// revision, so that an idle resource's resourceVersion still advances for
	// bookmarks and consistent reads.
	ProgressNotifyInterval time.Duration
	// LogLevel is the embedded etcd's log level.
	LogLevel string
}

// NewEmbeddedEtcdOptions returns the defaults.
func NewEmbeddedEtcdOptions() *EmbeddedEtcdOptions {
	return &EmbeddedEtcdOptions{
		QuotaBackendBytes:      2 << 30,
		ProgressNotifyInterval: 5 * time.Second,
		LogLevel:               "error",
	}
}

// AddFlags registers the embedded etcd flags.
func (o *EmbeddedEtcdOptions) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.ClientPort, "embedded-etcd-port", o.ClientPort,
		"Loopback port of the embedded etcd's client listener; 0 picks a free port. Ignored with --etcd-servers.")
	fs.Int64Var(&o.QuotaBackendBytes, "embedded-etcd-quota-backend-bytes", o.QuotaBackendBytes,
		"Backend size quota of the embedded etcd. Writes fail with NOSPACE past it.")
	fs.DurationVar(&o.ProgressNotifyInterval, "embedded-etcd-progress-notify-interval", o.ProgressNotifyInterval,
		"How often the embedded etcd sends progress notifications to idle watches.")
	fs.StringVar(&o.LogLevel, "embedded-etcd-log-level", o.LogLevel, "Log level of the embedded etcd.")
}

// Validate checks the options.
func (o *EmbeddedEtcdOptions) Validate() []error {
	var errs []error
	if o.ClientPort < 0 || o.ClientPort > 65535 {
		errs = append(errs, fmt.Errorf("--embedded-etcd-port must be between 0 and 65535"))
	}
	if o.QuotaBackendBytes <= 0 {
		errs = append(errs, fmt.Errorf("--embedded-etcd-quota-backend-bytes must be positive"))
	}
	if o.ProgressNotifyInterval <= 0 {
		errs = append(errs, fmt.Errorf("--embedded-etcd-progress-notify-interval must be positive"))
	}
	if _, err := parseEtcdLogLevel(o.LogLevel); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// embeddedEtcd is the etcd this process runs.
type embeddedEtcd struct {
	*embed.Etcd
	// stopping is set by Close, before etcd stops, so that its logger
	// drops the errors every listener reports when it closes.
	stopping *atomic.Bool
}

// Close stops etcd.
func (e embeddedEtcd) Close() {
	e.stopping.Store(true)
	e.Etcd.Close()
}

// start runs etcd with its data in dataDir/etcd and returns it once it
// serves. The caller closes it after the API server has shut down.
func (o *EmbeddedEtcdOptions) start(dataDir string) (embeddedEtcd, error) {
	stopping := &atomic.Bool{}
	logger, err := etcdLogger(o.LogLevel, stopping)
	if err != nil {
		return embeddedEtcd{}, fmt.Errorf("embedded etcd logger: %w", err)
	}
	dir := filepath.Join(dataDir, "etcd")
	started, endpoint, err := embedetcd.Start(embedetcd.Config{
		Name:                   "cached-apiserver",
		Dir:                    dir,
		ClientPort:             o.ClientPort,
		LogLevel:               o.LogLevel,
		Logger:                 logger,
		QuotaBackendBytes:      o.QuotaBackendBytes,
		ProgressNotifyInterval: o.ProgressNotifyInterval,
	})
	if err != nil {
		return embeddedEtcd{}, fmt.Errorf("embedded etcd: %w", err)
	}
	klog.InfoS("Embedded etcd is serving", "endpoint", endpoint, "dataDir", dir)
	return embeddedEtcd{Etcd: started, stopping: stopping}, nil
}
