package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1alpha1"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

const ns = "default"

func newAssignment(name, agent string) *v1beta1.Assignment {
	return &v1beta1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1beta1.AssignmentSpec{AgentName: agent, Payload: "work"},
	}
}

// TestAPI shares one server between the subtests that do not restart it,
// and runs them with our watch cache and with raw etcd3: the API must not
// tell the two apart.
func TestAPI(t *testing.T) {
	for _, watchCache := range []bool{true, false} {
		t.Run(fmt.Sprintf("watchCache=%v", watchCache), func(t *testing.T) {
			testAPI(t, startServer(t, t.TempDir(), fmt.Sprintf("--watch-cache=%v", watchCache)))
		})
	}
}

func testAPI(t *testing.T, s *testServer) {
	t.Run("CRUDBothVersions", func(t *testing.T) { testCRUDBothVersions(t, s) })
	t.Run("StatusSubresource", func(t *testing.T) { testStatusSubresource(t, s) })
	t.Run("FieldSelectors", func(t *testing.T) { testFieldSelectors(t, s) })
	t.Run("WatchOrder", func(t *testing.T) { testWatchOrder(t, s) })
	t.Run("WatchResume", func(t *testing.T) { testWatchResume(t, s) })
	t.Run("WatchAfterCompaction", func(t *testing.T) { testWatchAfterCompaction(t, s) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, s) })
	t.Run("Authentication", func(t *testing.T) { testAuthentication(t, s) })
	t.Run("Serializers", func(t *testing.T) { testSerializers(t, s) })
	t.Run("WatchList", func(t *testing.T) { testWatchList(t, s) })
}

func testCRUDBothVersions(t testing.TB, s *testServer) {
	ctx := context.Background()
	beta := s.Client.FleetV1beta1().Assignments(ns)
	alpha := s.Client.FleetV1alpha1().Assignments(ns)

	created, err := beta.Create(ctx, newAssignment("crud-beta", "agent-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.Status.Phase != v1beta1.AssignmentPending || created.Generation != 1 {
		t.Fatalf("create: phase=%q generation=%d, want Pending 1", created.Status.Phase, created.Generation)
	}
	// v1alpha1 reads the same object with the agent under spec.agent.
	got, err := alpha.Get(ctx, "crud-beta", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Agent != "agent-a" {
		t.Fatalf("v1alpha1 spec.agent = %q, want agent-a", got.Spec.Agent)
	}
	// Create through v1alpha1, read through v1beta1.
	_, err = alpha.Create(ctx, &v1alpha1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: "crud-alpha"},
		Spec:       v1alpha1.AssignmentSpec{Agent: "agent-b", Priority: 10},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := beta.Get(ctx, "crud-alpha", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Spec.AgentName != "agent-b" || b.Spec.Priority != 10 {
		t.Fatalf("v1beta1 view of a v1alpha1 create: %+v", b.Spec)
	}
	// A spec update bumps the generation; a label update does not.
	b.Spec.Priority = 20
	b, err = beta.Update(ctx, b, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Generation != 2 {
		t.Fatalf("generation after spec update = %d, want 2", b.Generation)
	}
	b.Labels = map[string]string{"team": "x"}
	b, err = beta.Update(ctx, b, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Generation != 2 {
		t.Fatalf("generation after label update = %d, want 2", b.Generation)
	}
	// Update through v1alpha1 keeps the agent.
	a, err := alpha.Get(ctx, "crud-alpha", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Spec.Payload = "new"
	if _, err := alpha.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The agent is immutable.
	a, _ = alpha.Get(ctx, "crud-alpha", metav1.GetOptions{})
	a.Spec.Agent = "agent-c"
	if _, err := alpha.Update(ctx, a, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("changing spec.agent: want 422 Invalid, got %v", err)
	}
	for _, name := range []string{"crud-beta", "crud-alpha"} {
		if err := beta.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := beta.Get(ctx, "crud-beta", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: want 404, got %v", err)
	}

	// Agents are cluster-scoped.
	agents := s.Client.FleetV1beta1().Agents()
	ag, err := agents.Create(ctx, &v1beta1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "agent-a"},
		Spec: v1beta1.AgentSpec{Zone: "z1", Capacity: 3}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ag.Namespace != "" {
		t.Fatalf("agent has namespace %q", ag.Namespace)
	}
	if err := agents.Delete(ctx, "agent-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func testStatusSubresource(t testing.TB, s *testServer) {
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments(ns)
	a, err := c.Create(ctx, newAssignment("status", "agent-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The main resource ignores status.
	a.Status.Phase = v1beta1.AssignmentRunning
	a, err = c.Update(ctx, a, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Status.Phase != v1beta1.AssignmentPending {
		t.Fatalf("main resource update changed phase to %q", a.Status.Phase)
	}
	// The status subresource ignores spec.
	a.Status = v1beta1.AssignmentStatus{Phase: v1beta1.AssignmentRunning, ObservedGeneration: a.Generation, Message: "started"}
	a.Spec.Priority = 99
	a, err = c.UpdateStatus(ctx, a, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Status.Phase != v1beta1.AssignmentRunning || a.Spec.Priority != 0 || a.Generation != 1 {
		t.Fatalf("status update: phase=%q priority=%d generation=%d", a.Status.Phase, a.Spec.Priority, a.Generation)
	}
	// Status through v1alpha1.
	alpha := s.Client.FleetV1alpha1().Assignments(ns)
	aa, err := alpha.Get(ctx, "status", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	aa.Status.Phase = v1alpha1.AssignmentSucceeded
	if aa, err = alpha.UpdateStatus(ctx, aa, metav1.UpdateOptions{}); err != nil || aa.Status.Phase != v1alpha1.AssignmentSucceeded {
		t.Fatalf("v1alpha1 status update: %v %v", aa, err)
	}
	aa.Status.Phase = "Exploded"
	if _, err := alpha.UpdateStatus(ctx, aa, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("invalid phase: want 422, got %v", err)
	}
}

func testFieldSelectors(t testing.TB, s *testServer) {
	ctx := context.Background()
	nsName := "selectors"
	c := s.Client.FleetV1beta1().Assignments(nsName)
	for i, agent := range []string{"sel-1", "sel-1", "sel-2"} {
		a := newAssignment("sel-"+string(rune('a'+i)), agent)
		a.Namespace = nsName
		if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.List(ctx, metav1.ListOptions{FieldSelector: "spec.agentName=sel-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("spec.agentName=sel-1 listed %d items, want 2", len(list.Items))
	}
	alist, err := s.Client.FleetV1alpha1().Assignments(nsName).List(ctx, metav1.ListOptions{FieldSelector: "spec.agent=sel-2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(alist.Items) != 1 || alist.Items[0].Spec.Agent != "sel-2" {
		t.Fatalf("v1alpha1 spec.agent=sel-2 listed %v", alist.Items)
	}
	// A watch with the selector sees only matching objects.
	w, err := c.Watch(ctx, metav1.ListOptions{FieldSelector: "spec.agentName=sel-2", ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, agent := range []string{"sel-1", "sel-2"} {
		a := newAssignment("later-"+agent, agent)
		a.Namespace = nsName
		if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ev := next(t, w)
	if got := ev.Object.(*v1beta1.Assignment); ev.Type != watch.Added || got.Name != "later-sel-2" {
		t.Fatalf("filtered watch got %s %s, want ADDED later-sel-2", ev.Type, got.Name)
	}
	// status.phase is selectable too.
	phase, err := c.List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Pending,metadata.name=sel-a"})
	if err != nil || len(phase.Items) != 1 {
		t.Fatalf("status.phase selector: %v, %v", phase, err)
	}
	agents, err := s.Client.FleetV1beta1().Agents().List(ctx, metav1.ListOptions{FieldSelector: "spec.zone=nowhere"})
	if err != nil || len(agents.Items) != 0 {
		t.Fatalf("agent spec.zone selector: %v, %v", agents, err)
	}
}

func testWatchOrder(t testing.TB, s *testServer) {
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("watch-order")
	w := watchFromList(t, c)
	a := newAssignment("w", "agent-a")
	a.Namespace = "watch-order"
	a, err := c.Create(ctx, a, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Spec.Priority = 3
	if _, err := c.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted} {
		if ev := next(t, w); ev.Type != want {
			t.Fatalf("got %s, want %s", ev.Type, want)
		}
	}
}

func testWatchResume(t testing.TB, s *testServer) {
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("resume")
	a := newAssignment("r", "agent-a")
	a.Namespace = "resume"
	first, err := c.Create(ctx, a, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first.Spec.Priority = 1
	second, err := c.Update(ctx, first, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Resuming from the create's RV replays exactly the update.
	w, err := c.Watch(ctx, metav1.ListOptions{ResourceVersion: first.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := next(t, w)
	if got := ev.Object.(*v1beta1.Assignment); ev.Type != watch.Modified || got.ResourceVersion != second.ResourceVersion {
		t.Fatalf("resumed watch got %s rv=%s, want MODIFIED rv=%s", ev.Type, got.ResourceVersion, second.ResourceVersion)
	}
}

func testWatchAfterCompaction(t testing.TB, s *testServer) {
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("compaction")
	a := newAssignment("c", "agent-a")
	a.Namespace = "compaction"
	old, err := c.Create(ctx, a, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var last *v1beta1.Assignment
	for i := int32(1); i <= 3; i++ {
		old.Spec.Priority = i
		if last, err = c.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		old.ResourceVersion = last.ResourceVersion
	}
	rev := mustParseRV(t, last.ResourceVersion)
	// Compact the way kube-apiserver's compactor does, so that every
	// apiserver sharing this etcd learns of it.
	if _, _, _, err := etcd3.Compact(ctx, s.etcdClient(t), 0, rev); err != nil {
		t.Fatal(err)
	}
	// The watch cache learns of the compaction from etcd shortly after it
	// happens; until then it may still serve the old events from its history.
	var last410 watch.Event
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		w, err := c.Watch(ctx, metav1.ListOptions{ResourceVersion: "2"})
		if err != nil {
			// A watch may also be refused up front with 410.
			return apierrors.IsResourceExpired(err) || apierrors.IsGone(err), nil
		}
		defer w.Stop()
		last410 = next(t, w)
		return last410.Type == watch.Error, nil
	})
	if err != nil {
		t.Fatalf("a watch from a compacted RV never got 410: %v", err)
	}
	if status, ok := last410.Object.(*metav1.Status); ok && (status.Code != 410 || status.Reason != metav1.StatusReasonExpired) {
		t.Fatalf("watch from a compacted RV: got %#v, want a 410 Expired Status", status)
	}

	// On the wire: a 200 response whose stream carries one ERROR event with
	// a 410 Expired Status.
	httpClient, err := rest.HTTPClientFor(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := httpClient.Get(s.URL + "/apis/fleet.example.com/v1beta1/namespaces/compaction/assignments?watch=true&resourceVersion=2")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var frame struct {
		Type   string        `json:"type"`
		Object metav1.Status `json:"object"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&frame); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || frame.Type != "ERROR" || frame.Object.Code != 410 || frame.Object.Reason != metav1.StatusReasonExpired {
		t.Fatalf("HTTP %d with %s %d %s, want 200 with ERROR 410 Expired", resp.StatusCode, frame.Type, frame.Object.Code, frame.Object.Reason)
	}
}

// testWatchList asks for the initial state as watch events, as watch-list
// informers do, and checks that it ends with the initial-events-end bookmark.
func testWatchList(t testing.TB, s *testServer) {
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("watchlist")
	for _, agent := range []string{"wl-1", "wl-1", "wl-2"} {
		a := newAssignment("", agent)
		a.GenerateName, a.Namespace = "wl-", "watchlist"
		if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sendInitialEvents := true
	w, err := c.Watch(ctx, metav1.ListOptions{
		SendInitialEvents: &sendInitialEvents, AllowWatchBookmarks: true,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		FieldSelector:        "spec.agentName=wl-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := 0; i < 2; i++ {
		if ev := next(t, w); ev.Type != watch.Added || ev.Object.(*v1beta1.Assignment).Spec.AgentName != "wl-1" {
			t.Fatalf("initial event %d: %s %v, want ADDED for agent wl-1", i, ev.Type, ev.Object)
		}
	}
	ev := next(t, w)
	a, _ := ev.Object.(*v1beta1.Assignment)
	if ev.Type != watch.Bookmark || a == nil || a.Annotations[metav1.InitialEventsAnnotationKey] != "true" || a.ResourceVersion == "" {
		t.Fatalf("after the initial events got %s %v, want the initial-events-end BOOKMARK", ev.Type, ev.Object)
	}
}

func next(t testing.TB, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("watch closed")
		}
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no watch event within 30s")
	}
	return watch.Event{}
}
