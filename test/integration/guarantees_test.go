package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// Two reproductions of issue 56 through the API, as a user met them.

// TestResourceVersionSurvivesProgress restarts the server over an etcd
// compacted at its head, so that the restarted cache cannot fill its
// history, lists Assignments, and writes an Agent: etcd's revision moves,
// and the Assignments cache hears only a progress notification. A watch
// from the list's resourceVersion must then be served. The history used to
// move its floor to the progress notification's revision, and the watch got
// "410 too old resource version", where upstream's Cacher serves it:
// informers re-watching from their last bookmark re-listed after every
// restart, on every resource that was idle while another was written.
func TestResourceVersionSurvivesProgress(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := startServer(t, dir)
	for i := range 3 {
		if _, err := s.Client.FleetV1beta1().Assignments(ns).Create(ctx, newAssignment(fmt.Sprintf("before-%d", i), "agent-a"),
			metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Compacted at its head, as the server's own compactor does every 5
	// minutes: a restart cannot fill the history from before it.
	head, err := s.etcdClient(t).Get(ctx, "probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := etcd3.Compact(ctx, s.etcdClient(t), 0, head.Header.Revision); err != nil {
		t.Fatal(err)
	}
	s.stop()

	s = startServer(t, dir)
	assignments := s.Client.FleetV1beta1().Assignments(ns)
	list, err := assignments.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := s.Client.FleetV1beta1().Agents().Create(ctx, &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "moves-etcd"}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A consistent read makes the Assignments cache catch up with etcd:
	// through a progress notification, as it has no event to hear.
	after, err := assignments.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mustParseRV(t, after.ResourceVersion) < mustParseRV(t, agent.ResourceVersion) {
		t.Fatalf("a consistent list at %s, before the agent written at %s", after.ResourceVersion, agent.ResourceVersion)
	}

	w, err := assignments.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatalf("watch from the list's resourceVersion %s: %v", list.ResourceVersion, err)
	}
	defer w.Stop()
	created, err := assignments.Create(ctx, newAssignment("after", "agent-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w); ev.Type != watch.Added || ev.Object.(*v1beta1.Assignment).Name != created.Name {
		t.Fatalf("watch from %s after a progress notification: got %s %v, want ADDED %s", list.ResourceVersion, ev.Type,
			apierrors.FromObject(ev.Object), created.Name)
	}
}

// readyzObjects is how many Assignments TestReadyzWaitsForCaches restarts
// over: enough that the cache's first list takes a while on two cores.
const readyzObjects = 20_000

// TestReadyzWaitsForCaches restarts the server over readyzObjects
// Assignments and polls /readyz and a list of each resource, without
// retries, from the moment it listens. /readyz must not answer 200 before
// both lists do, and must soon after: within the readiness hook's poll
// (upstream's StorageReadinessHook checks every 100 ms) and two of the
// test's rounds, the one that saw the lists and the next, which is the
// earliest a /readyz after the hook's check can be asked. It used to answer 200 at 0.68
// s while lists answered 429 until 3.24 s: a rolling update marked the new
// pod Ready and took the next old one down while the new one refused reads.
// It also answered 200 at --storage-initialization-timeout while the lists
// still answered 429: at a million objects, 60 s against 77 s.
func TestReadyzWaitsForCaches(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := startServer(t, dir)
	fill(t, s.etcdClient(t), readyzObjects)
	s.stop()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	// The storage-readiness hook gives up at the timeout and lets /readyz
	// pass; a timeout shorter than the start checks that /readyz still
	// waits for the caches (watch-cache-initialized), as it must at a
	// million objects, where the first list outlasts the 1-minute default.
	inst, _ := runServer(t, ln, []string{"--data-dir", dir, "--embedded-etcd-log-level", "fatal", "--storage-initialization-timeout", "100ms"})
	cfg, err := clientcmd.BuildConfigFromFlags("", inst.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rest.UnversionedRESTClientFor(withNegotiation(cfg))
	if err != nil {
		t.Fatal(err)
	}
	status := func(ctx context.Context, path string) int {
		var code int
		req := rc.Get().AbsPath(path).MaxRetries(0)
		if path != "/readyz" {
			req = req.Param("limit", "1")
		}
		req.Do(ctx).StatusCode(&code)
		return code
	}
	// Each round asks /readyz first, then both lists. The first 200 from
	// /readyz must be followed, in that round, by 200 from both lists: a
	// list asked right after /readyz said ready must be served. (Comparing
	// when each request completed would not do: on a busy machine a list
	// can complete well after the /readyz that preceded it.)
	lists := []string{"/apis/fleet.example.com/v1beta1/assignments", "/apis/fleet.example.com/v1beta1/agents"}
	var readyAt, listedAt, longestRound time.Duration
	listed := map[string]bool{}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		roundStart, wasListed := time.Now(), listedAt != 0
		defer func() {
			// Only rounds that began once the lists answered: before, a
			// list waits for the cache, which is not the hook's delay.
			if wasListed {
				longestRound = max(longestRound, time.Since(roundStart))
			}
		}()
		ready := readyAt == 0 && status(ctx, "/readyz") == http.StatusOK
		if ready {
			readyAt = time.Since(started)
		}
		for _, p := range lists {
			code := status(ctx, p)
			if ready && code != http.StatusOK {
				t.Errorf("/readyz answered 200 at %v, and a list of %s right after it answered %d", readyAt, p, code)
			}
			if code == http.StatusOK {
				listed[p] = true
			}
		}
		if listedAt == 0 && len(listed) == len(lists) {
			listedAt = time.Since(started)
		}
		return readyAt != 0 && listedAt != 0, nil
	}); err != nil {
		t.Fatalf("/readyz (%v) or the lists (%v) did not answer 200 within 2 minutes", readyAt, listedAt)
	}
	// The check that holds /readyz past the hook's timeout is there: over
	// 20,000 objects the other checks take about as long as the caches,
	// so the rounds alone would not show it missing.
	verbose, err := rc.Get().AbsPath("/readyz").Param("verbose", "true").MaxRetries(0).DoRaw(ctx)
	if err != nil || !strings.Contains(string(verbose), "[+]watch-cache-initialized ok") {
		t.Errorf("/readyz?verbose has no passing watch-cache-initialized check (%v):\n%s", err, verbose)
	}
	t.Logf("over %d assignments: /readyz 200 at %v, both lists at %v, longest round from then %v", readyzObjects,
		readyAt.Round(time.Millisecond), listedAt.Round(time.Millisecond), longestRound.Round(time.Millisecond))
	// On a quiet machine a round takes a few milliseconds and the bound is
	// about 0.12 s; a loaded CI machine stretches the rounds, not the
	// hook's poll. A /readyz that waits for anything more than the hook's
	// next check (0.68 s late, as above) still fails.
	const hookPoll = 100 * time.Millisecond
	if gap, bound := readyAt-listedAt, hookPoll+10*time.Millisecond+2*max(longestRound, 10*time.Millisecond); gap > bound {
		t.Errorf("/readyz answered 200 %v after the lists did, want within %v (the hook's poll and two rounds of %v)", gap, bound, longestRound)
	}
}

// fill writes n Assignments straight to etcd, as the server stores them, in
// transactions of etcd's largest size.
func fill(t testing.TB, c *clientv3.Client, n int) {
	t.Helper()
	const perTxn = 128 // etcd's default --max-txn-ops
	for i := 0; i < n; {
		var ops []clientv3.Op
		for ; i < n && len(ops) < perTxn; i++ {
			a := v1beta1.Assignment{TypeMeta: metav1.TypeMeta{Kind: "Assignment", APIVersion: v1beta1.SchemeGroupVersion.String()},
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("a-%05d", i), Namespace: ns, UID: types.UID(fmt.Sprintf("uid-%05d", i)),
					CreationTimestamp: metav1.Now()},
				Spec: v1beta1.AssignmentSpec{AgentName: "agent-a", Payload: "work"}}
			v, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			ops = append(ops, clientv3.OpPut("/registry/fleet.example.com/assignments/"+ns+"/"+a.Name, string(v)))
		}
		if _, err := c.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
}
