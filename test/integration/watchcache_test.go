package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// metricValue sums the samples of a counter or gauge, or the sums of a
// histogram's, whose labels include want.
func metricValue(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, want) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetHistogram().GetSampleSum()
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	found := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			found++
		}
	}
	return found == len(want)
}

// etcdWatchers is the number of watchers the in-process etcd serves.
func etcdWatchers(t testing.TB) float64 {
	return metricValue(t, prometheus.DefaultGatherer, "etcd_debugging_mvcc_watcher_total", nil)
}

// TestOneEtcdWatchPerResource opens 500 HTTP watches on assignments and
// counts etcd's watchers: with the cache they add none, without it one each.
func TestOneEtcdWatchPerResource(t *testing.T) {
	const watchers = 500
	for _, tc := range []struct {
		flag string
		want float64
	}{
		{flag: "--watch-cache=true", want: 0},
		{flag: "--watch-cache=false", want: watchers},
		// As upstream: 0 turns the cache off for one resource, and other
		// sizes are ignored because the event log sizes itself.
		{flag: "--watch-cache-sizes=assignments.fleet.example.com#0", want: watchers},
		{flag: "--watch-cache-sizes=assignments.fleet.example.com#100", want: 0},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			s := startServer(t, t.TempDir(), tc.flag)
			ctx := context.Background()
			c := s.Client.FleetV1beta1().Assignments("fanout")
			list, err := c.List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			before := etcdWatchers(t)
			ws := make([]watch.Interface, watchers)
			for i := range ws {
				if ws[i], err = c.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion}); err != nil {
					t.Fatal(err)
				}
				defer ws[i].Stop()
			}
			a := newAssignment("fanout", "agent-a")
			a.Namespace = "fanout"
			if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// Every watch is established once it delivered the create.
			var wg sync.WaitGroup
			for _, w := range ws {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if ev := next(t, w); ev.Type != watch.Added {
						t.Errorf("got %s, want ADDED", ev.Type)
					}
				}()
			}
			wg.Wait()
			if got := etcdWatchers(t) - before; got != tc.want {
				t.Fatalf("%d HTTP watches opened %v etcd watchers, want %v", watchers, got, tc.want)
			}
		})
	}
}

// etcdListReads counts the range reads the server made for assignments'
// lists, as opposed to the revision reads of consistent reads.
func etcdListReads(t testing.TB) float64 {
	total := 0.0
	for _, op := range []string{"list", "listWithCount", "listStream"} {
		total += metricValue(t, legacyregistry.DefaultGatherer, "etcd_requests_total",
			map[string]string{"operation": op, "resource": "assignments"})
	}
	return total
}

// TestConsistentListsFromCache checks that consistent lists cost etcd one
// revision read each and no range read, where raw etcd3 reads the range.
func TestConsistentListsFromCache(t *testing.T) {
	const lists = 200
	for _, tc := range []struct {
		watchCache bool
		wantRanges float64
	}{{watchCache: true, wantRanges: 0}, {watchCache: false, wantRanges: lists}} {
		t.Run(fmt.Sprintf("watchCache=%v", tc.watchCache), func(t *testing.T) {
			s := startServer(t, t.TempDir(), fmt.Sprintf("--watch-cache=%v", tc.watchCache))
			ctx := context.Background()
			c := s.Client.FleetV1beta1().Assignments("consistent")
			for i := 0; i < 20; i++ {
				a := newAssignment(fmt.Sprintf("a-%02d", i), "agent-a")
				a.Namespace = "consistent"
				if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			ranges := etcdListReads(t)
			revisionReads := metricValue(t, legacyregistry.DefaultGatherer, "etcd_requests_total",
				map[string]string{"operation": "getCurrentResourceVersion", "resource": "assignments"})
			for i := 0; i < lists; i++ {
				list, err := c.List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if len(list.Items) != 20 {
					t.Fatalf("consistent list %d returned %d items, want 20", i, len(list.Items))
				}
			}
			if got := etcdListReads(t) - ranges; got != tc.wantRanges {
				t.Errorf("%d consistent lists made %v etcd range reads, want %v", lists, got, tc.wantRanges)
			}
			gotRevisionReads := metricValue(t, legacyregistry.DefaultGatherer, "etcd_requests_total",
				map[string]string{"operation": "getCurrentResourceVersion", "resource": "assignments"}) - revisionReads
			if tc.watchCache && gotRevisionReads > lists {
				t.Errorf("%d consistent lists made %v revision reads, want at most %d", lists, gotRevisionReads, lists)
			}
		})
	}
}

// TestPagingWhileWriting pages through 2,000 assignments 100 at a time while
// other assignments are created, and gets each of the 2,000 exactly once.
func TestPagingWhileWriting(t *testing.T) {
	const total, pageSize = 2000, 100
	s := startServer(t, t.TempDir())
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("paging")
	createMany(t, s, "paging", "item", total)

	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			a := newAssignment(fmt.Sprintf("zz-during-%04d", i), "agent-b")
			a.Namespace = "paging"
			if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
				t.Errorf("concurrent create: %v", err)
				return
			}
		}
	}()

	seen := map[string]int{}
	opts := metav1.ListOptions{Limit: pageSize}
	firstRV := ""
	for pages := 0; ; pages++ {
		list, err := c.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if firstRV == "" {
			firstRV = list.ResourceVersion
		} else if list.ResourceVersion != firstRV {
			t.Fatalf("page %d is at resourceVersion %s, the first at %s", pages, list.ResourceVersion, firstRV)
		}
		for _, a := range list.Items {
			seen[a.Name]++
		}
		if list.Continue == "" {
			break
		}
		if list.RemainingItemCount == nil {
			t.Fatalf("page %d has a continue token but no remainingItemCount", pages)
		}
		opts.Continue = list.Continue
	}
	close(stop)
	<-writerDone
	for i := 0; i < total; i++ {
		name := fmt.Sprintf("item-%04d", i)
		if seen[name] != 1 {
			t.Fatalf("%s seen %d times, want once", name, seen[name])
		}
	}
}

// TestExactResourceVersionList lists at a past resourceVersion and gets
// exactly the state at that point.
func TestExactResourceVersionList(t *testing.T) {
	s := startServer(t, t.TempDir())
	ctx := context.Background()
	c := s.Client.FleetV1beta1().Assignments("exact")
	createMany(t, s, "exact", "before", 5)
	past, err := c.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	createMany(t, s, "exact", "after", 5)
	if err := c.Delete(ctx, "before-0000", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := c.List(ctx, metav1.ListOptions{ResourceVersion: past.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != past.ResourceVersion || len(got.Items) != len(past.Items) {
		t.Fatalf("exact list at %s: rv=%s with %d items, want %d items", past.ResourceVersion, got.ResourceVersion, len(got.Items), len(past.Items))
	}
	for i := range got.Items {
		if got.Items[i].Name != past.Items[i].Name || got.Items[i].ResourceVersion != past.Items[i].ResourceVersion {
			t.Fatalf("item %d: got %s@%s, want %s@%s", i, got.Items[i].Name, got.Items[i].ResourceVersion,
				past.Items[i].Name, past.Items[i].ResourceVersion)
		}
	}
}

// createMany creates n assignments named prefix-0000… in parallel.
func createMany(t testing.TB, s *testServer, namespace, prefix string, n int) {
	t.Helper()
	c := s.Client.FleetV1beta1().Assignments(namespace)
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				a := &v1beta1.Assignment{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", prefix, i), Namespace: namespace},
					Spec:       v1beta1.AssignmentSpec{AgentName: fmt.Sprintf("agent-%d", i%50)},
				}
				if _, err := c.Create(context.Background(), a, metav1.CreateOptions{}); err != nil {
					t.Errorf("create %d: %v", i, err)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}
