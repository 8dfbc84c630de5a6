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
	// AdvertisedPeerPort, when set, is the port its peers reach it on: its
	// PeerProxy's.
	AdvertisedPeerPort int
}

// ClientURL is where the member serves clients.
func (m Member) ClientURL() string { return loopbackURL(m.ClientPort) }

// PeerURL is where the member listens for its peers.
func (m Member) PeerURL() string { return loopbackURL(m.PeerPort) }

// AdvertisedPeerURL is where its peers reach it.
func (m Member) AdvertisedPeerURL() string {
	if m.AdvertisedPeerPort != 0 {
		return loopbackURL(m.AdvertisedPeerPort)
	}
	return m.PeerURL()
}

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
		initial[i] = c.Name + "=" + c.AdvertisedPeerURL()
	}
	state := "new"
	if existing {
		state = "existing"
	}
	return []string{
		"--name", m.Name,
		"--data-dir", m.Dir,
		"--listen-client-urls", m.ClientURL(), "--advertise-client-urls", m.ClientURL(),
		"--listen-peer-urls", m.PeerURL(), "--initial-advertise-peer-urls", m.AdvertisedPeerURL(),
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-state", state,
		"--log-level", "error",
		"--unsafe-no-fsync",
		// A test that finds etcd's watches stalled reads where etcd's
		// goroutines wait (/debug/pprof on the client URL).
		"--enable-pprof",
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
	// PeerProxies puts a PeerProxy in front of every member's peer port,
	// for Partition.
	PeerProxies bool
}

// EtcdCluster is etcd as member processes on 127.0.0.1, killed when the
// test ends.
type EtcdCluster struct {
	Config  EtcdConfig
	Members []Member
	Procs   []*Process
	// PeerProxies are the members' peer proxies, with EtcdConfig.PeerProxies.
	PeerProxies []*PeerProxy
}

// StartEtcd starts the members; they serve once a majority runs.
func StartEtcd(tb testing.TB, cfg EtcdConfig) *EtcdCluster {
	tb.Helper()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	c := &EtcdCluster{Config: cfg}
	for i := range cfg.Members {
		m := NewMember(tb, cfg.Dir, fmt.Sprintf("m%d", i+1))
		if cfg.PeerProxies {
			p, err := NewPeerProxy(fmt.Sprintf("127.0.0.1:%d", m.PeerPort))
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(p.Close)
			m.AdvertisedPeerPort = p.Port()
			c.PeerProxies = append(c.PeerProxies, p)
		}
		c.Members = append(c.Members, m)
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

// Partition cuts the members into groups, by index, that cannot reach each
// other until HealPartition; members in no group keep every link. It needs
// EtcdConfig.PeerProxies.
func (c *EtcdCluster) Partition(groups ...[]int) {
	group := map[int]int{}
	for g, members := range groups {
		for _, m := range members {
			group[m] = g
		}
	}
	for to, p := range c.PeerProxies {
		gt, ok := group[to]
		if !ok {
			continue
		}
		var cut []string
		for from, m := range c.Members {
			if gf, ok := group[from]; ok && gf != gt {
				cut = append(cut, m.AdvertisedPeerURL())
			}
		}
		p.Cut(cut...)
	}
}

// HealPartition ends a Partition.
func (c *EtcdCluster) HealPartition() {
	for _, p := range c.PeerProxies {
		p.Heal()
	}
}
