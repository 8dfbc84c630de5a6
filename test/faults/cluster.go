package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cached-apiserver/cached-apiserver/internal/loopbacketcd"
)

// cluster is an etcd cluster of real processes on 127.0.0.1.
type cluster struct {
	members []loopbacketcd.Member
	procs   []*process
	// client reaches every member directly, not through a proxy. It does
	// not require a leader, so the ground truth's watch survives faults.
	client *clientv3.Client
	// truthClient reaches only the last member, so that the ground truth's
	// watch is known to be there when counting a member's watchers.
	truthClient *clientv3.Client
}

// startCluster starts n members, each with etcd's flags for loopback and
// extra, and waits until they have a leader.
func startCluster(tb testing.TB, etcdBin, dir string, n int, extra ...string) *cluster {
	tb.Helper()
	members, err := loopbacketcd.NewMembers(dir, n)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	c := &cluster{members: members}
	for _, m := range members {
		c.procs = append(c.procs, startProcess(tb, "etcd-"+m.Name, filepath.Join(dir, m.Name+".log"), etcdBin, nil,
			append(loopbacketcd.Args(m, members), extra...)...))
	}
	endpoints := make([]string, n)
	for i, m := range members {
		endpoints[i] = m.ClientURL()
	}
	c.client, err = clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.client.Close() })
	c.truthClient, err = clientv3.New(clientv3.Config{Endpoints: endpoints[n-1:], DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.truthClient.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.waitLeader(ctx); err != nil {
		tb.Fatalf("etcd never elected a leader: %v", err)
	}
	return c
}

// kill SIGKILLs member i.
func (c *cluster) kill(i int) { c.procs[i].kill() }

// restart starts a killed member i again with its data.
func (c *cluster) restart(i int) error { return c.procs[i].start() }

// leader returns the index of the member every running member agrees
// leads, or -1.
func (c *cluster) leader(ctx context.Context) int {
	var lead uint64
	self := map[uint64]int{}
	for i := range c.members {
		if !c.procs[i].running() {
			continue
		}
		st, err := c.status(ctx, i)
		if err != nil || st.Leader == 0 || (lead != 0 && st.Leader != lead) {
			return -1
		}
		lead = st.Leader
		self[st.Header.MemberId] = i
	}
	if i, ok := self[lead]; ok {
		return i
	}
	return -1
}

// status asks member i for its status.
func (c *cluster) status(ctx context.Context, i int) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return c.client.Status(ctx, c.members[i].ClientURL())
}

// waitLeader waits until the running members agree on a leader and a
// linearizable read succeeds.
func (c *cluster) waitLeader(ctx context.Context) error {
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if c.leader(ctx) < 0 {
			return false, nil
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.client.Get(rctx, "/health")
		return err == nil, nil
	})
}

// hasLeader reports whether member i currently knows a leader.
func (c *cluster) hasLeader(ctx context.Context, i int) bool {
	st, err := c.status(ctx, i)
	return err == nil && st.Leader != 0
}

// moveLeader transfers leadership to member to.
func (c *cluster) moveLeader(ctx context.Context, to int) error {
	from := c.leader(ctx)
	if from < 0 {
		return fmt.Errorf("no leader to move")
	}
	st, err := c.status(ctx, to)
	if err != nil {
		return err
	}
	// MoveLeader must reach the current leader.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.members[from].ClientURL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.MoveLeader(ctx, st.Header.MemberId)
	return err
}

// defragment defragments member i.
func (c *cluster) defragment(ctx context.Context, i int) error {
	_, err := c.client.Defragment(ctx, c.members[i].ClientURL())
	return err
}

// compactRevKey is where API servers record etcd compactions, so that
// every server's etcd3 store learns of them (k8s.io/apiserver/pkg/storage/etcd3/compact.go).
const compactRevKey = "compact_rev_key"

// compactToHead compacts etcd at its current revision, recording the
// compaction as an API server's compactor does.
func (c *cluster) compactToHead(ctx context.Context) error {
	resp, err := c.client.Get(ctx, "/health")
	if err != nil {
		return err
	}
	rev := resp.Header.Revision
	if _, err := c.client.Put(ctx, compactRevKey, strconv.FormatInt(rev, 10)); err != nil {
		return err
	}
	if _, err = c.client.Compact(ctx, rev); errors.Is(err, rpctypes.ErrCompacted) {
		return nil // nothing was written since the last compaction
	}
	return err
}

// serverWatchers returns how many etcd watchers member i holds for others
// than the ground truth, from its metrics.
func (c *cluster) serverWatchers(ctx context.Context, i int) (int, error) {
	n, err := c.watchers(ctx, i)
	if i == len(c.members)-1 {
		n-- // the ground truth's
	}
	return n, err
}

// watchers returns member i's count of open etcd watchers, from its metrics.
func (c *cluster) watchers(ctx context.Context, i int) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.members[i].ClientURL()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watcher_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("member %d reports no etcd_debugging_mvcc_watcher_total", i)
}
