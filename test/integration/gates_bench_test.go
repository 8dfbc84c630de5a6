package integration

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// BenchmarkGatesBehindAggregator is issue 58's A/B of the cache's gate (and,
// before it removed them, its pacing knobs and list gate) where the server
// runs in a cluster: in aggregated mode
// behind a real kube-apiserver, with priority and fairness on in both, and
// the load from users that priority and fairness does not exempt, under a
// FlowSchema and priority level written here (gatesFlowControl).
//
// Each round runs every variant on a control plane of its own, one after
// the other: GATES_OBJECTS Assignments of 1 KiB (10,000), then writes alone,
// one after another from one client, then GATES_WATCHLISTS watch-lists
// (100, as make bench-watchlist-writes) and GATES_LISTS full lists (4) at
// once beside the same writes. It prints, per variant, medians and ranges
// over GATES_ROUNDS rounds (3) of the writes' p99 alone and beside the
// reads, the watch-lists' p50 and last, the lists' last, the server's CPU
// during the reads, and the 429s the clients met.
//
// GATES_VARIANTS=name,… picks among gatesVariants; GATES_ALT=path,… adds
// server binaries, for an A/B of a change. make bench-gates runs it.
func BenchmarkGatesBehindAggregator(b *testing.B) {
	cfg := gatesConfig{
		objects:    testkit.EnvInt("GATES_OBJECTS", 10_000),
		watchLists: testkit.EnvInt("GATES_WATCHLISTS", 100),
		lists:      testkit.EnvInt("GATES_LISTS", 4),
	}
	variants := gatesVariants
	if names := os.Getenv("GATES_VARIANTS"); names != "" {
		variants = nil
		for _, v := range gatesVariants {
			if slices.Contains(strings.Split(names, ","), v.name) {
				variants = append(variants, v)
			}
		}
	}
	if alts := os.Getenv("GATES_ALT"); alts != "" {
		for _, alt := range strings.Split(alts, ",") {
			variants = append(variants, gatesVariant{name: "alt=" + filepath.Base(alt), bin: alt})
		}
	}
	results := map[string][]gatesResult{}
	for round := range testkit.EnvInt("GATES_ROUNDS", 3) {
		for _, v := range variants {
			b.Run(fmt.Sprintf("%s/round=%d", v.name, round), func(b *testing.B) {
				r := runGates(b, cfg, v)
				b.Logf("%s, round %d: %s", v.name, round, r)
				results[v.name] = append(results[v.name], r)
			})
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nbehind kube-apiserver with priority and fairness: %d objects, %d watch-lists, %d lists; median (min–max) of %d rounds\n\n",
		cfg.objects, cfg.watchLists, cfg.lists, testkit.EnvInt("GATES_ROUNDS", 3))
	fmt.Fprintln(&out, "| variant | writes p99 alone | writes p99 beside | watch-lists p50 | watch-lists last | lists last | server CPU | 429s |")
	fmt.Fprintln(&out, "|---|---|---|---|---|---|---|---|")
	for _, v := range variants {
		rs := results[v.name]
		fmt.Fprintf(&out, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", v.name,
			spread(rs, func(r gatesResult) float64 { return ms(r.writesAlone) }, "%.1f ms"),
			spread(rs, func(r gatesResult) float64 { return ms(r.writesBeside) }, "%.1f ms"),
			spread(rs, func(r gatesResult) float64 { return r.watchListP50.Seconds() }, "%.2f s"),
			spread(rs, func(r gatesResult) float64 { return r.watchListLast.Seconds() }, "%.2f s"),
			spread(rs, func(r gatesResult) float64 { return r.listLast.Seconds() }, "%.2f s"),
			spread(rs, func(r gatesResult) float64 { return r.serverCPU.Seconds() }, "%.1f s"),
			spread(rs, func(r gatesResult) float64 { return float64(r.rejected) }, "%.0f"))
	}
	fmt.Print(out.String())
}

// gatesVariant is a server to run: bin, ours if empty, with args.
type gatesVariant struct {
	name, bin string
	args      []string
}

// gatesVariants are our server with its gate as it ships, and with the
// gate turned off by its flag.
var gatesVariants = []gatesVariant{
	{name: "gates"},
	{name: "none", args: []string{"--watch-cache-initial-events-concurrency=0"}},
}

type gatesConfig struct {
	objects, watchLists, lists int
}

// gatesResult is one variant's run.
type gatesResult struct {
	writesAlone, writesBeside      time.Duration // p99
	watchListP50, watchListLast    time.Duration
	listLast                       time.Duration
	serverCPU                      time.Duration // during the reads
	rejected                       int64         // 429s, retried
	watchListEvents, writesBesideN int
}

func (r gatesResult) String() string {
	return fmt.Sprintf("writes p99 alone %.1f ms, beside %.1f ms (%d); watch-lists p50 %.2f s, last %.2f s (%d events); lists last %.2f s; server CPU %.1f s; 429s %d",
		ms(r.writesAlone), ms(r.writesBeside), r.writesBesideN, r.watchListP50.Seconds(), r.watchListLast.Seconds(),
		r.watchListEvents, r.listLast.Seconds(), r.serverCPU.Seconds(), r.rejected)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// spread is the median of f over rs, and its range.
func spread[R any](rs []R, f func(R) float64, format string) string {
	vs := sortedBy(rs, f)
	if len(vs) == 0 {
		return "–"
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", vs[len(vs)/2], vs[0], vs[len(vs)-1])
}

// median is the median of f over rs, 0 if there are none.
func median[R any](rs []R, f func(R) float64) float64 {
	if vs := sortedBy(rs, f); len(vs) > 0 {
		return vs[len(vs)/2]
	}
	return 0
}

func sortedBy[R any](rs []R, f func(R) float64) []float64 {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	slices.Sort(vs)
	return vs
}

const (
	gatesNamespace = "bench"
	gatesGroup     = "bench-load"
	gatesWatcher   = "bench-watcher"
	gatesWriter    = "bench-writer"
)

// runGates runs one variant on a control plane of its own, which it stops
// before it returns.
func runGates(b *testing.B, cfg gatesConfig, v gatesVariant) gatesResult {
	srv := &asProcess{bin: v.bin, extra: v.args}
	cp := startControlPlaneWith(b, srv, gatesNamespace)
	writer := cp.user(b, gatesWriter, gatesGroup)
	gatesFlowControl(b, cp, writer)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	load(ctx, b, versioned.NewForConfigOrDie(cp.direct(b, "loader", user.SystemPrivilegedGroup)), cfg.objects)

	writes := func(stop <-chan struct{}, max int) []time.Duration {
		var took []time.Duration
		for i := 0; i < max; i++ {
			select {
			case <-stop:
				return took
			default:
			}
			a := &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{GenerateName: "write-"}, Spec: v1beta1.AssignmentSpec{AgentName: "writer"}}
			t0 := time.Now()
			if _, err := writer.FleetV1beta1().Assignments(gatesNamespace).Create(ctx, a, metav1.CreateOptions{}); err != nil {
				b.Fatalf("write %d: %v", i, err)
			}
			took = append(took, time.Since(t0))
		}
		return took
	}
	var r gatesResult
	// Writes right after a start are slower while its garbage is
	// collected: these are not measured.
	writes(nil, 500)
	r.writesAlone = p99(writes(nil, 1500))

	reader := cp.userConfig(b, gatesWatcher, gatesGroup)
	hc, err := rest.HTTPClientFor(reader)
	if err != nil {
		b.Fatal(err)
	}
	base := reader.Host + "/apis/fleet.example.com/v1beta1/namespaces/" + gatesNamespace + "/assignments"
	cpu0, err := srv.proc.CPU()
	if err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	beside := make(chan []time.Duration, 1)
	go func() { beside <- writes(stop, 100_000) }()
	t0 := time.Now()
	var rejected atomic.Int64
	var wg sync.WaitGroup
	watchLists := make([]time.Duration, cfg.watchLists)
	events := make([]int, cfg.watchLists)
	for i := range cfg.watchLists {
		wg.Go(func() {
			body := get(ctx, b, hc, base+"?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", &rejected)
			defer body.Close()
			events[i] = initialEvents(b, body)
			watchLists[i] = time.Since(t0)
		})
	}
	lists := make([]time.Duration, cfg.lists)
	for i := range cfg.lists {
		wg.Go(func() {
			body := get(ctx, b, hc, base, &rejected)
			defer body.Close()
			if _, err := io.Copy(io.Discard, body); err != nil {
				b.Errorf("list: %v", err)
			}
			lists[i] = time.Since(t0)
		})
	}
	wg.Wait()
	cpu1, err := srv.proc.CPU()
	if err != nil {
		b.Fatal(err)
	}
	close(stop)
	besideWrites := <-beside
	slices.Sort(watchLists)
	slices.Sort(lists)
	r.writesBeside, r.writesBesideN = p99(besideWrites), len(besideWrites)
	r.watchListP50, r.watchListLast = watchLists[len(watchLists)/2], watchLists[len(watchLists)-1]
	r.listLast = lists[len(lists)-1]
	r.serverCPU, r.rejected = cpu1-cpu0, rejected.Load()
	r.watchListEvents = events[0]
	for _, n := range events {
		if n < cfg.objects {
			b.Errorf("a watch-list sent %d initial events, fewer than the %d objects", n, cfg.objects)
		}
	}
	cp.stopServer()
	return r
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// gatesFlowControl puts the bench's users under a priority level of their
// own, as a cluster operator would for a tenant: not exempt, 30 shares,
// queued, one flow per user. Both kube-apiserver and our server (which
// reads the objects from it) classify the bench's requests with it; it
// waits until writer, one of those users, is authorized.
func gatesFlowControl(b *testing.B, cp *controlPlane, writer versioned.Interface) {
	ctx := context.Background()
	fc := cp.Kube.FlowcontrolV1()
	_, err := fc.PriorityLevelConfigurations().Create(ctx, &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](30),
				LimitResponse: flowcontrolv1.LimitResponse{
					Type:    flowcontrolv1.LimitResponseTypeQueue,
					Queuing: &flowcontrolv1.QueuingConfiguration{Queues: 64, HandSize: 6, QueueLengthLimit: 50},
				},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	_, err = fc.FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "bench"},
			MatchingPrecedence:         500,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindGroup, Group: &flowcontrolv1.GroupSubject{Name: gatesGroup}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"},
					Resources: []string{"*"}, Namespaces: []string{"*"}, ClusterScope: true}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	grantBenchGroup(ctx, b, cp, "bench-load", v1beta1.SchemeGroupVersion.Group)
	// Both servers must classify with the schema before the load starts:
	// its status says the kube-apiserver's controller has seen it, and
	// our server's informers see it within moments; a request as the
	// writer that succeeds shows RBAC has reached the authorizer.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		fs, err := fc.FlowSchemas().Get(ctx, "bench", metav1.GetOptions{})
		if err != nil || len(fs.Status.Conditions) == 0 {
			return false, nil
		}
		_, err = writer.FleetV1beta1().Assignments(gatesNamespace).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		b.Fatalf("the bench's FlowSchema or RBAC never took effect: %v", err)
	}
}

// grantBenchGroup lets the bench's users do anything to apiGroup's
// resources, through a ClusterRole and binding called name.
func grantBenchGroup(ctx context.Context, b *testing.B, cp *controlPlane, name, apiGroup string) {
	rbac := cp.Kube.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{apiGroup}, Resources: []string{"*"}, Verbs: []string{"*"}}}},
		metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: gatesGroup}}},
		metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// load creates n Assignments of 1 KiB through client, 16 at a time.
func load(ctx context.Context, b *testing.B, client versioned.Interface, n int) {
	payload := strings.Repeat("x", 1024)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				a := &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("load-%06d", i)},
					Spec: v1beta1.AssignmentSpec{AgentName: fmt.Sprintf("agent-%d", i%100), Payload: payload}}
				if _, err := client.FleetV1beta1().Assignments(gatesNamespace).Create(ctx, a, metav1.CreateOptions{}); err != nil {
					b.Errorf("load %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// get GETs url until it answers other than 429, waiting as Retry-After
// says (at most a second), counts the 429s, and returns the body of a 200.
func get(ctx context.Context, b *testing.B, hc *http.Client, url string, rejected *atomic.Int64) io.ReadCloser {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Accept", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			return resp.Body
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			b.Fatalf("GET %s: %d %.300s", url, resp.StatusCode, body)
		}
		rejected.Add(1)
		wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		select {
		case <-time.After(min(time.Duration(cmp.Or(wait, 1))*time.Second, time.Second)):
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
	}
}

// initialEvents reads a watch-list's events up to its initial-events-end
// bookmark and returns how many objects it sent before it.
func initialEvents(b *testing.B, body io.Reader) int {
	dec := json.NewDecoder(bufio.NewReaderSize(body, 64<<10))
	n := 0
	for {
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			b.Errorf("watch-list ended after %d events: %v", n, err)
			return n
		}
		switch ev.Type {
		case "ADDED":
			n++
		case "BOOKMARK":
			if ev.Object.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
				return n
			}
		}
	}
}

// asProcess runs our server binary, or bin, as a process of its own, with
// the Deployment's arguments and extra, so that its CPU is its own.
type asProcess struct {
	bin   string
	extra []string
	proc  *testkit.Process
}

func (*asProcess) listen(t testing.TB) (string, net.Listener) {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testkit.FreePort(t))), nil
}

func (p *asProcess) start(t testing.TB, cp *controlPlane, manifests string, _ net.Listener) {
	t.Helper()
	_, port, err := net.SplitHostPort(cp.backendAddr)
	if err != nil {
		t.Fatal(err)
	}
	args := append(deploymentArgs(t, manifests, filepath.Join(cp.dir, "server")), cp.serverKubeconfigFlags(t)...)
	args = append(args, "--secure-port="+port, "--embedded-etcd-log-level=fatal")
	bin := p.bin
	if bin == "" {
		bin = testkit.Build(t, testkit.Ours)[0]
	}
	p.proc = testkit.StartProcess(t, testkit.ProcessConfig{Name: "cached-apiserver", Bin: bin,
		Args: append(args, p.extra...), Grace: 30 * time.Second})
	cp.stopServer = func() { _ = p.proc.Terminate(30 * time.Second) }
	waitReady(t, cp.direct(t, user.SystemPrivilegedGroup, user.SystemPrivilegedGroup))
}
