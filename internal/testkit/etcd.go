package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/embedetcd"
)

// Member is one member of an etcd cluster on 127.0.0.1 that runs as its
// own process (test/cmd/etcd, which is etcd's own main), so that a test can
// kill it.
type Member struct {
	// Name is the member's name in the cluster.
	Name string
	// Dir is its data directory.
	Dir string
	// ClientPort and PeerPort are its ports on 127.0.0.1.
	ClientPort, PeerPort int
}

// ClientURL is where the member serves clients.
func (m Member) ClientURL() string { return loopbackURL(m.ClientPort) }

// PeerURL is where the member talks to its peers.
func (m Member) PeerURL() string { return loopbackURL(m.PeerPort) }

func loopbackURL(port int) string {
	u := embedetcd.LoopbackURL(port)
	return u.String()
}

// NewMember returns a member with free ports and its data in dir/name.
func NewMember(tb testing.TB, dir, name string) Member {
	tb.Helper()
	return Member{Name: name, Dir: filepath.Join(dir, name), ClientPort: FreePort(tb), PeerPort: FreePort(tb)}
}

// Args returns the etcd flags that run m as a member of cluster, with the
// same throwaway settings as embedetcd's Throwaway: no fsync and
// error-level logs. etcd ignores the initial-cluster flags once its data
// directory exists, so the same flags restart a killed member. existing
// joins a running cluster instead of forming a new one.
func Args(m Member, cluster []Member, existing bool) []string {
	initial := make([]string, len(cluster))
	for i, c := range cluster {
		initial[i] = c.Name + "=" + c.PeerURL()
	}
	state := "new"
	if existing {
		state = "existing"
	}
	return []string{
		"--name", m.Name,
		"--data-dir", m.Dir,
		"--listen-client-urls", m.ClientURL(), "--advertise-client-urls", m.ClientURL(),
		"--listen-peer-urls", m.PeerURL(), "--initial-advertise-peer-urls", m.PeerURL(),
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-state", state,
		"--log-level", "error",
		"--unsafe-no-fsync",
	}
}

// EtcdConfig is an etcd cluster of member processes.
type EtcdConfig struct {
	// Bin is etcd's binary (Build(tb, Etcd)).
	Bin string
	// Dir holds the members' data and logs.
	Dir string
	// Members is how many: 1 or 3 in practice.
	Members int
	// Extra are flags for every member.
	Extra []string
}

// EtcdCluster is etcd as member processes on 127.0.0.1, killed when the
// test ends.
type EtcdCluster struct {
	Config  EtcdConfig
	Members []Member
	Procs   []*Process
}

// StartEtcd starts the members; they serve once a majority runs.
func StartEtcd(tb testing.TB, cfg EtcdConfig) *EtcdCluster {
	tb.Helper()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	c := &EtcdCluster{Config: cfg}
	for i := range cfg.Members {
		c.Members = append(c.Members, NewMember(tb, cfg.Dir, fmt.Sprintf("m%d", i+1)))
	}
	for _, m := range c.Members {
		c.Procs = append(c.Procs, c.StartMember(tb, m, false))
	}
	return c
}

// StartMember runs m as a member of c, with its log beside its data.
func (c *EtcdCluster) StartMember(tb testing.TB, m Member, existing bool) *Process {
	return StartProcess(tb, ProcessConfig{
		Name: "etcd-" + m.Name, Bin: c.Config.Bin, LogPath: filepath.Join(c.Config.Dir, m.Name+".log"),
		Args: append(Args(m, c.Members, existing), c.Config.Extra...),
	})
}

// Endpoints are the members' client URLs.
func (c *EtcdCluster) Endpoints() []string {
	urls := make([]string, len(c.Members))
	for i, m := range c.Members {
		urls[i] = m.ClientURL()
	}
	return urls
}
