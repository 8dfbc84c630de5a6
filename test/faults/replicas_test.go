package faults

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// TestReplicasAgree runs two replicas over a 3-member cluster and checks
// that they answer as one server would: what is written through one is read
// through the other, 200 times out of 200, and a continue token or an exact
// resourceVersion one served is served by the other. With -chaos the
// upstream-wired server is asserted too: these are correctness, not
// performance.
func TestReplicasAgree(t *testing.T) {
	impls := []string{ours}
	if *chaos {
		impls = append(impls, upstream)
	}
	for _, impl := range impls {
		t.Run(impl, func(t *testing.T) {
			ctx := context.Background()
			e := setUp(t, scenario{members: 3, serverMembers: []int{0, 1, 2}, replicas: 2}, impl, "")
			a := e.newClient(0).FleetV1beta1().Assignments("replicas")
			b := e.newClient(1).FleetV1beta1().Assignments("replicas")

			// Read your writes across replicas.
			misses := 0
			for i := 0; i < 200; i++ {
				created, err := a.Create(ctx, &v1beta1.Assignment{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ryw-%03d", i)},
					Spec:       v1beta1.AssignmentSpec{AgentName: agents[i%len(agents)]},
				}, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				list, err := b.List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if parseRV(list.ResourceVersion) < parseRV(created.ResourceVersion) || itemsOf(list.Items)["replicas/"+created.Name] == 0 {
					misses++
					t.Errorf("write %d through A at %s: missing from a consistent list through B at %s", i, created.ResourceVersion, list.ResourceVersion)
				}
				if got, err := b.Get(ctx, created.Name, metav1.GetOptions{}); err != nil || got.ResourceVersion != created.ResourceVersion {
					misses++
					t.Errorf("write %d through A: get through B: %v", i, err)
				}
			}
			t.Logf("%s: read-your-writes across replicas: %d of 200 reads missed", impl, misses)

			// A continue token from A, continued on B.
			first, err := a.List(ctx, metav1.ListOptions{Limit: 50})
			if err != nil || first.Continue == "" {
				t.Fatalf("first page through A: %v, continue %q", err, first.Continue)
			}
			items := itemsOf(first.Items)
			for token := first.Continue; token != ""; {
				page, err := b.List(ctx, metav1.ListOptions{Limit: 50, Continue: token})
				if err != nil {
					t.Fatalf("continuing A's list through B: %v", err)
				}
				if page.ResourceVersion != first.ResourceVersion {
					t.Errorf("B's page is at %s, A's first page at %s", page.ResourceVersion, first.ResourceVersion)
				}
				for k, v := range itemsOf(page.Items) {
					items[k] = v
				}
				token = page.Continue
			}
			// An exact list at the resourceVersion A served, through B.
			exact, err := b.List(ctx, metav1.ListOptions{ResourceVersion: first.ResourceVersion,
				ResourceVersionMatch: metav1.ResourceVersionMatchExact})
			if err != nil {
				t.Fatalf("exact list through B at A's %s: %v", first.ResourceVersion, err)
			}
			if d, _ := watchcheck.Diff(items, itemsOf(exact.Items)); d != "" || len(items) != 200 {
				t.Errorf("A's paged list (%d items) and B's exact list at %s differ: %s", len(items), first.ResourceVersion, d)
			}
		})
	}
}
