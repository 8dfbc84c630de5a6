package integration

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage/etcd3"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/informers/externalversions"
)

// events records what an informer's handler saw.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(kind string, obj any) {
	name := ""
	if a, ok := obj.(*v1beta1.Assignment); ok {
		name = a.Name
	} else if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		name = d.Key
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, kind+" "+name)
}

func (e *events) handler() cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { e.add("add", obj) },
		UpdateFunc: func(_, obj any) { e.add("update", obj) },
		DeleteFunc: func(obj any) { e.add("delete", obj) },
	}
}

func (e *events) waitFor(t testing.TB, want string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, got := range e.log {
			if got == want {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("informer never saw %q", want)
	}
}

// storeNames lists "name@resourceVersion" of an informer's store, sorted.
func storeNames(store cache.Store) []string {
	var out []string
	for _, obj := range store.List() {
		a := obj.(*v1beta1.Assignment)
		out = append(out, a.Name+"@"+a.ResourceVersion)
	}
	sort.Strings(out)
	return out
}

// TestInformers drives informers from the generated factory, with and
// without watch-list, through sync, changes, a server restart and an etcd
// compaction, and checks that the store ends equal to a fresh list.
func TestInformers(t *testing.T) {
	for _, watchList := range []bool{true, false} {
		t.Run(fmt.Sprintf("WatchListClient=%v", watchList), func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, watchList)
			testInformer(t)
		})
	}
}

func testInformer(t testing.TB) {
	const total = 5000
	dir := t.TempDir()
	s := startServer(t, dir)
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("inf")
	createMany(t, s, "inf", "item", total)

	stop := make(chan struct{})
	defer close(stop)
	factory := externalversions.NewSharedInformerFactoryWithOptions(s.Client, 0, externalversions.WithNamespace("inf"))
	informer := factory.Fleet().V1beta1().Assignments().Informer()
	seen := &events{}
	if _, err := informer.AddEventHandler(seen.handler()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, informer.HasSynced) {
		t.Fatal("informer never synced")
	}
	t.Logf("synced %d assignments in %v", total, time.Since(start))
	if n := len(informer.GetStore().List()); n != total {
		t.Fatalf("synced store holds %d assignments, want %d", n, total)
	}

	// Adds, updates and deletes reach the handler.
	a := newAssignment("fresh", "agent-x")
	a.Namespace = "inf"
	if a, _ = c.Create(ctx, a, metav1.CreateOptions{}); a == nil {
		t.Fatal("create failed")
	}
	seen.waitFor(t, "add fresh")
	a.Spec.Priority = 7
	if _, err := c.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	seen.waitFor(t, "update fresh")
	if err := c.Delete(ctx, "fresh", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	seen.waitFor(t, "delete fresh")

	// Restart the server on the same address, change things while the
	// informer re-establishes, and compact etcd behind it.
	s.stop()
	s = startServerOn(t, s.Addr, dir)
	c = s.Client.FleetV1beta1().Assignments("inf")
	for i := 0; i < 20; i++ {
		if err := c.Delete(ctx, fmt.Sprintf("item-%04d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	after := newAssignment("after-restart", "agent-y")
	after.Namespace = "inf"
	last, err := c.Create(ctx, after, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := etcd3.Compact(ctx, s.etcdClient(t), 0, mustParseRV(t, last.ResourceVersion)); err != nil {
		t.Fatal(err)
	}
	more := newAssignment("after-compaction", "agent-y")
	more.Namespace = "inf"
	if _, err := c.Create(ctx, more, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The store converges to a fresh list: no phantom, no missing object.
	var want []string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		want = want[:0]
		for _, a := range list.Items {
			want = append(want, a.Name+"@"+a.ResourceVersion)
		}
		sort.Strings(want)
		return fmt.Sprint(storeNames(informer.GetStore())) == fmt.Sprint(want), nil
	})
	if err != nil {
		got := storeNames(informer.GetStore())
		t.Fatalf("informer store (%d objects) never matched a fresh list (%d objects)", len(got), len(want))
	}
}

// TestFilteredInformers checks informers with field selectors: one per
// agent sees only its own work; one on status.phase sees an object leave
// the selector (delete) and come back (add).
func TestFilteredInformers(t *testing.T) {
	s := startServer(t, t.TempDir())
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("filtered")
	createMany(t, s, "filtered", "work", 200) // agents agent-0 … agent-49
	stop := make(chan struct{})
	defer close(stop)

	byAgent := externalversions.NewSharedInformerFactoryWithOptions(s.Client, 0, externalversions.WithTweakListOptions(
		func(o *metav1.ListOptions) { o.FieldSelector = "spec.agentName=agent-7" }))
	mine := byAgent.Fleet().V1beta1().Assignments().Informer()
	byPhase := externalversions.NewSharedInformerFactoryWithOptions(s.Client, 0, externalversions.WithTweakListOptions(
		func(o *metav1.ListOptions) { o.FieldSelector = "status.phase=Running" }))
	running := byPhase.Fleet().V1beta1().Assignments().Informer()
	seen := &events{}
	if _, err := running.AddEventHandler(seen.handler()); err != nil {
		t.Fatal(err)
	}
	byAgent.Start(stop)
	byPhase.Start(stop)
	if !cache.WaitForCacheSync(stop, mine.HasSynced, running.HasSynced) {
		t.Fatal("filtered informers never synced")
	}
	for _, obj := range mine.GetStore().List() {
		if a := obj.(*v1beta1.Assignment); a.Spec.AgentName != "agent-7" {
			t.Fatalf("agent-7's informer holds %s for %s", a.Name, a.Spec.AgentName)
		}
	}
	if n := len(mine.GetStore().List()); n != 4 {
		t.Fatalf("agent-7's informer holds %d assignments, want 4", n)
	}
	if n := len(running.GetStore().List()); n != 0 {
		t.Fatalf("the Running informer holds %d assignments before any runs", n)
	}

	setPhase := func(phase v1beta1.AssignmentPhase) {
		a, err := c.Get(ctx, "work-0007", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a.Status.Phase = phase
		if _, err := c.UpdateStatus(ctx, a, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setPhase(v1beta1.AssignmentRunning)
	seen.waitFor(t, "add work-0007")
	setPhase(v1beta1.AssignmentSucceeded)
	seen.waitFor(t, "delete work-0007")
	seen.log = nil
	setPhase(v1beta1.AssignmentRunning)
	seen.waitFor(t, "add work-0007")
}

// TestMetadataInformer follows assignments as PartialObjectMetadata, as the
// garbage collector and namespace controller do.
func TestMetadataInformer(t *testing.T) {
	s := startServer(t, t.TempDir())
	ctx := context.Background()
	createMany(t, s, "meta", "m", 50)
	stop := make(chan struct{})
	defer close(stop)
	gvr := v1beta1.SchemeGroupVersion.WithResource("assignments")
	informer := metadatainformer.NewFilteredMetadataInformer(metadata.NewForConfigOrDie(s.Config), gvr, "meta", 0,
		cache.Indexers{}, nil).Informer()
	go informer.Run(stop)
	if !cache.WaitForCacheSync(stop, informer.HasSynced) {
		t.Fatal("metadata informer never synced")
	}
	if n := len(informer.GetStore().List()); n != 50 {
		t.Fatalf("metadata informer holds %d objects, want 50", n)
	}
	c := s.Client.FleetV1beta1().Assignments("meta")
	if err := c.Delete(ctx, "m-0000", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a, err := c.Get(ctx, "m-0001", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Labels = map[string]string{"touched": "yes"}
	if _, err := c.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, deletedStill, _ := informer.GetStore().GetByKey("meta/m-0000")
		obj, exists, _ := informer.GetStore().GetByKey("meta/m-0001")
		if !exists || deletedStill {
			return false, nil
		}
		m := obj.(*metav1.PartialObjectMetadata)
		return m.Labels["touched"] == "yes", nil
	})
	if err != nil {
		obj, exists, _ := informer.GetStore().GetByKey("meta/m-0001")
		_, deletedStill, _ := informer.GetStore().GetByKey("meta/m-0000")
		t.Fatalf("metadata informer did not follow the delete (still there: %v) and the update (%v %#v)", deletedStill, exists, obj)
	}
}

// TestDeleteCollection deletes by label selector and checks that a watcher
// sees every DELETED.
func TestDeleteCollection(t *testing.T) {
	s := startServer(t, t.TempDir())
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("dc")
	for i := 0; i < 30; i++ {
		a := newAssignment(fmt.Sprintf("dc-%02d", i), "agent-a")
		a.Namespace = "dc"
		if i%3 == 0 {
			a.Labels = map[string]string{"batch": "old"}
		}
		if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w := watchFromList(t, c)
	if err := c.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "batch=old"}); err != nil {
		t.Fatal(err)
	}
	deleted := map[string]bool{}
	for len(deleted) < 10 {
		ev := next(t, w)
		if ev.Type != watch.Deleted {
			t.Fatalf("got %s, want only DELETED", ev.Type)
		}
		deleted[ev.Object.(*v1beta1.Assignment).Name] = true
	}
	for i := 0; i < 30; i += 3 {
		if !deleted[fmt.Sprintf("dc-%02d", i)] {
			t.Fatalf("dc-%02d deleted without a DELETED event", i)
		}
	}
	rest, err := c.List(ctx, metav1.ListOptions{})
	if err != nil || len(rest.Items) != 20 {
		t.Fatalf("after deletecollection %d assignments remain, want 20 (%v)", len(rest.Items), err)
	}
}
