package loopbacketcd

import (
	"fmt"
	"net"
	"strconv"
	"strings"
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
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// NewMembers returns n members with free ports and data directories under dir.
func NewMembers(dir string, n int) ([]Member, error) {
	members := make([]Member, n)
	for i := range members {
		client, err := FreePort()
		if err != nil {
			return nil, err
		}
		peer, err := FreePort()
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("m%d", i+1)
		members[i] = Member{Name: name, Dir: dir + "/" + name, ClientPort: client, PeerPort: peer}
	}
	return members, nil
}

// Args returns the etcd flags that run m as a member of cluster, with the
// same throwaway settings as Start: no fsync (a killed process still leaves
// its writes in the page cache; only a machine crash would lose them) and
// error-level logs. etcd ignores the initial-cluster flags once its data
// directory exists, so the same flags restart a killed member.
func Args(m Member, cluster []Member) []string {
	initial := make([]string, len(cluster))
	for i, c := range cluster {
		initial[i] = c.Name + "=" + c.PeerURL()
	}
	return []string{
		"--name", m.Name,
		"--data-dir", m.Dir,
		"--listen-client-urls", m.ClientURL(), "--advertise-client-urls", m.ClientURL(),
		"--listen-peer-urls", m.PeerURL(), "--initial-advertise-peer-urls", m.PeerURL(),
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-state", "new",
		"--log-level", "error",
		"--unsafe-no-fsync",
	}
}
