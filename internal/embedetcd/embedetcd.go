// Package embedetcd is the one configuration of an etcd embedded in a Go
// process, on 127.0.0.1: the server's own (durable) and the tests' and
// benchmarks' (throwaway) differ only in the fields of Config.
package embedetcd

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config is an embedded etcd's configuration.
type Config struct {
	// Name is the member's name; etcd's default when empty.
	Name string
	// Dir is the data directory.
	Dir string
	// ClientPort and PeerPort are loopback ports; 0 picks a free one.
	ClientPort, PeerPort int
	// LogLevel is etcd's log level; "error" when empty.
	LogLevel string
	// Logger, when set, is the logger etcd uses instead of building its own.
	Logger *zap.Logger
	// QuotaBackendBytes is the backend size quota; etcd's default when 0.
	QuotaBackendBytes int64
	// ProgressNotifyInterval is how often idle watches hear the current
	// revision; etcd's default when 0.
	ProgressNotifyInterval time.Duration
	// Throwaway skips fsync: for data no one needs after a crash of the
	// machine (tests and benchmarks). A killed process still leaves its
	// writes in the page cache.
	Throwaway bool
	// ReadyTimeout bounds the wait for etcd to serve; a minute when 0.
	ReadyTimeout time.Duration
}

// Start runs etcd and returns it once it serves, with its client URL. The
// API server compacts etcd itself, so etcd's own auto-compaction is off.
func Start(c Config) (*embed.Etcd, string, error) {
	for _, p := range []*int{&c.ClientPort, &c.PeerPort} {
		if *p != 0 {
			continue
		}
		free, err := FreePort()
		if err != nil {
			return nil, "", err
		}
		*p = free
	}
	cfg := embed.NewConfig()
	if c.Name != "" {
		cfg.Name = c.Name
	}
	cfg.Dir = c.Dir
	cfg.LogLevel = "error"
	if c.LogLevel != "" {
		cfg.LogLevel = c.LogLevel
	}
	if c.Logger != nil {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(c.Logger)
	}
	if c.QuotaBackendBytes > 0 {
		cfg.QuotaBackendBytes = c.QuotaBackendBytes
	}
	if c.ProgressNotifyInterval > 0 {
		cfg.WatchProgressNotifyInterval = c.ProgressNotifyInterval
	}
	cfg.UnsafeNoFsync = c.Throwaway
	cfg.AutoCompactionRetention = "0"
	client, peer := LoopbackURL(c.ClientPort), LoopbackURL(c.PeerPort)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("starting etcd in %s: %w", cfg.Dir, err)
	}
	timeout := c.ReadyTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(timeout):
		e.Close()
		return nil, "", fmt.Errorf("etcd in %s did not become ready within %v", cfg.Dir, timeout)
	}
	return e, client.String(), nil
}

// LoopbackURL is http://127.0.0.1:port, an etcd client or peer URL.
func LoopbackURL(port int) url.URL {
	return url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
}
