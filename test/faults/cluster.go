package faults

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// cluster is an etcd cluster of real processes on 127.0.0.1, with the
// clients and operations the faults need.
type cluster struct {
	*testkit.EtcdCluster
	tb testing.TB
	// client reaches every member directly, not through a proxy. It does
	// not require a leader, so the ground truth's watch survives faults.
	client *clientv3.Client
	// truthClient reaches only the last member, so that the ground truth's
	// watch is known to be there when counting a member's watchers.
	truthClient *clientv3.Client
	// compactions are those compactToHead made.
	compactions compactionLog
}

// startCluster starts cfg's members and waits until they have a leader.
func startCluster(tb testing.TB, cfg testkit.EtcdConfig) *cluster {
	tb.Helper()
	c := &cluster{tb: tb, EtcdCluster: testkit.StartEtcd(tb, cfg)}
	n := cfg.Members
	endpoints := c.Endpoints()
	var err error
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
func (c *cluster) kill(i int) { c.Procs[i].Kill() }

// restart starts a killed member i again with its data.
func (c *cluster) restart(i int) error { return c.Procs[i].Start() }

// leader returns the index of the member every running member agrees
// leads, or -1.
func (c *cluster) leader(ctx context.Context) int {
	var lead uint64
	self := map[uint64]int{}
	for i := range c.Members {
		if !c.Procs[i].Running() {
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
	return c.client.Status(ctx, c.Members[i].ClientURL())
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

// losesLeaderWithin watches member i for d, and reports whether it was
// without a leader at some point: a fault that should cost it its leader
// proves nothing otherwise.
func (c *cluster) losesLeaderWithin(ctx context.Context, i int, d time.Duration) bool {
	lost := false
	for start := time.Now(); time.Since(start) < d; {
		lost = lost || !c.hasLeader(ctx, i)
		hold(ctx, 100*time.Millisecond)
	}
	return lost
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
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Members[from].ClientURL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.MoveLeader(ctx, st.Header.MemberId)
	return err
}

// defragment defragments member i.
func (c *cluster) defragment(ctx context.Context, i int) error {
	_, err := c.client.Defragment(ctx, c.Members[i].ClientURL())
	return err
}

// compactRevKey is where API servers record etcd compactions, so that
// every server's etcd3 store learns of them (k8s.io/apiserver/pkg/storage/etcd3/compact.go).
const compactRevKey = "compact_rev_key"

// head returns etcd's current revision, read around the proxies.
func (c *cluster) head(ctx context.Context) (int64, error) {
	resp, err := c.client.Get(ctx, "/health")
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// compactToHead compacts etcd at its current revision, recording the
// compaction as an API server's compactor does.
func (c *cluster) compactToHead(ctx context.Context) error {
	rev, err := c.head(ctx)
	if err != nil {
		return err
	}
	if _, err := c.client.Put(ctx, compactRevKey, strconv.FormatInt(rev, 10)); err != nil {
		return err
	}
	// Recorded as of the request: a client may see its effect before it
	// returns.
	c.compactions.record(rev, time.Now())
	if _, err = c.client.Compact(ctx, rev); errors.Is(err, rpctypes.ErrCompacted) {
		return nil // nothing was written since the last compaction
	}
	return err
}

// compactionLog records the compactions of etcd a run made: a 410 for a
// resourceVersion before one is etcd's own answer, not the server's doing.
type compactionLog struct {
	// mu guards revs and ats.
	mu   sync.Mutex
	revs []int64
	ats  []time.Time
}

func (l *compactionLog) record(rev int64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.revs, l.ats = append(l.revs, rev), append(l.ats, at)
}

// before returns the newest compaction requested before t, 0 if none.
func (l *compactionLog) before(t time.Time) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var rev int64
	for i, at := range l.ats {
		if at.Before(t) {
			rev = max(rev, l.revs[i])
		}
	}
	return rev
}

// busiestForServer returns which of the first n members holds most of the
// server's etcd watchers, and each one's count.
func (c *cluster) busiestForServer(ctx context.Context, n int) (busiest int, counts []int, err error) {
	for i := range n {
		w, err := c.serverWatchers(ctx, i)
		if err != nil {
			return 0, nil, err
		}
		counts = append(counts, w)
		if w > counts[busiest] {
			busiest = i
		}
	}
	return busiest, counts, nil
}

// serverWatchers returns how many etcd watchers member i holds for others
// than the ground truth, from its metrics.
func (c *cluster) serverWatchers(ctx context.Context, i int) (int, error) {
	n, err := c.watchers(ctx, i)
	if i == len(c.Members)-1 {
		n-- // the ground truth's
	}
	return n, err
}

// watchers returns member i's count of open etcd watchers, from its metrics.
func (c *cluster) watchers(ctx context.Context, i int) (int, error) {
	lines, err := memberMetrics(ctx, c.Members[i].ClientURL())
	if err != nil {
		return 0, err
	}
	for _, line := range lines {
		if v, ok := strings.CutPrefix(line, "etcd_debugging_mvcc_watcher_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("member %d reports no etcd_debugging_mvcc_watcher_total", i)
}

// memberMetrics returns the lines of the metrics of the member at clientURL.
func memberMetrics(ctx context.Context, clientURL string) ([]string, error) {
	body, err := get(ctx, clientURL+"/metrics")
	if err != nil {
		return nil, err
	}
	return strings.Split(string(body), "\n"), nil
}

// replace removes member i from the cluster, stops it, and adds a new
// member in its place with an empty data directory, as an operator replaces
// a failed machine (etcd's runtime reconfiguration guide). It returns once
// the new member serves with the cluster's leader.
func (c *cluster) replace(ctx context.Context, i int) error {
	old := c.Members[i]
	list, err := c.client.MemberList(ctx)
	if err != nil {
		return err
	}
	var id uint64
	for _, m := range list.Members {
		if m.Name == old.Name {
			id = m.ID
		}
	}
	if id == 0 {
		return fmt.Errorf("no member named %s", old.Name)
	}
	// etcd refuses while a member it would leave has been connected for
	// less than its health interval (5 s): "unhealthy cluster".
	// Each attempt has its own timeout: a request that reached a member as
	// the membership changed can wait for a reply that never comes.
	var removeErr error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, removeErr = c.client.MemberRemove(actx, id)
		return removeErr == nil || errors.Is(removeErr, rpctypes.ErrMemberNotFound), nil
	}); err != nil {
		return fmt.Errorf("removing %s: %w", old.Name, removeErr)
	}
	c.Procs[i].Kill()
	// The removed member may have led; the rest elect a leader first.
	if err := c.waitLeader(ctx); err != nil {
		return err
	}
	m := testkit.NewMember(c.tb, c.Config.Dir, old.Name+"r")
	var addErr error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, addErr = c.client.MemberAdd(actx, []string{m.PeerURL()})
		// An attempt that timed out may still have been applied.
		return addErr == nil || errors.Is(addErr, rpctypes.ErrPeerURLExist), nil
	}); err != nil {
		return fmt.Errorf("adding %s: %w", m.Name, addErr)
	}
	c.Members[i] = m
	c.client.SetEndpoints(c.Endpoints()...)
	c.Procs[i] = c.StartMember(c.tb, m, true)
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return c.hasLeader(ctx, i), nil
	})
}
