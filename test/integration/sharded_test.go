package integration

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/cache"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/informers/externalversions"
)

// TestShardedInformers runs four client-go informers through the
// kube-aggregator, each on one quarter of the UID hash space (the
// reflector's list options tweak, as a horizontally sharded controller
// sets it), with the ShardedListAndWatch feature gate on. Through creates,
// updates, deletes and a restart of our server, together they hold exactly
// what a full list holds, each object in exactly one informer, the one
// whose quarter holds its UID's hash.
func TestShardedInformers(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ShardedListAndWatch, true)
	a, _ := startAggregatedReplicas(t, 1, "--feature-gates", "ShardedListAndWatch=true")
	const ns, shards = "sharded", 4
	client := a.Front.Client.FleetV1beta1().Assignments(ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	stores := make([]cache.Store, shards)
	for i := range shards {
		lo, hi := uidQuarter(i)
		selector := fmt.Sprintf("shardRange(object.metadata.uid, '0x%016x', '%s')", lo, hi)
		factory := externalversions.NewSharedInformerFactoryWithOptions(a.Front.Client, 0, externalversions.WithNamespace(ns),
			externalversions.WithTweakListOptions(func(o *metav1.ListOptions) { o.ShardSelector = selector }))
		inf := factory.Fleet().V1beta1().Assignments().Informer()
		stores[i] = inf.GetStore()
		factory.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatalf("informer %d never synced", i)
		}
	}

	// The informers, together, against a list: each object once, in its shard.
	converged := func(step string) {
		t.Helper()
		var last, listErr string
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err := client.List(ctx, metav1.ListOptions{})
			if err != nil {
				listErr = err.Error()
				return false, nil
			}
			var want []string
			for _, o := range list.Items {
				want = append(want, fmt.Sprintf("%s@%s in %d", o.Name, o.ResourceVersion, shardOf(string(o.UID))))
			}
			var got []string
			for i, s := range stores {
				for _, obj := range s.List() {
					o := obj.(*v1beta1.Assignment)
					got = append(got, fmt.Sprintf("%s@%s in %d", o.Name, o.ResourceVersion, i))
				}
			}
			slices.Sort(want)
			slices.Sort(got)
			last = fmt.Sprintf("informers hold %v,\nthe list %v", got, want)
			return slices.Equal(got, want), nil
		})
		if err != nil {
			t.Fatalf("%s: %s (last list error: %q)", step, last, listErr)
		}
	}
	create := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := retryOn503(ctx, func() error {
				_, err := client.Create(ctx, &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("a-%03d", i)},
					Spec: v1beta1.AssignmentSpec{AgentName: fmt.Sprintf("agent-%d", i%5)}}, metav1.CreateOptions{})
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	change := func(from, to int, del bool) {
		t.Helper()
		for i := from; i < to; i++ {
			name := fmt.Sprintf("a-%03d", i)
			err := retryOn503(ctx, func() error {
				if del {
					return client.Delete(ctx, name, metav1.DeleteOptions{})
				}
				o, err := client.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				o.Status.Phase = v1beta1.AssignmentRunning
				_, err = client.UpdateStatus(ctx, o, metav1.UpdateOptions{})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	create(0, 40)
	converged("after 40 creates")
	change(0, 10, false)
	change(10, 20, true)
	converged("after updates and deletes")
	if n := len(stores[0].List()) + len(stores[1].List()) + len(stores[2].List()) + len(stores[3].List()); n != 30 {
		t.Fatalf("the informers hold %d objects, want 30", n)
	}
	for i, s := range stores {
		if len(s.List()) == 0 {
			t.Fatalf("informer %d holds nothing: the UIDs did not spread, and the test shows nothing", i)
		}
	}

	a.restart(t, 0)
	create(40, 60)
	change(20, 25, false)
	change(25, 30, true)
	change(40, 45, true)
	converged("after a restart, creates, updates and deletes")
}

// uidQuarter returns the bounds of the i-th quarter of the hash space.
func uidQuarter(i int) (lo uint64, hi string) {
	lo = uint64(i) << 62
	if i == 3 {
		return lo, "0x10000000000000000"
	}
	return lo, fmt.Sprintf("0x%016x", uint64(i+1)<<62)
}

// shardOf is the quarter a UID's FNV-1a hash falls in, as KEP-5866 defines it.
func shardOf(uid string) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(uid))
	return int(h.Sum64() >> 62)
}

// retryOn503 retries fn while our server is away behind the aggregator.
func retryOn503(ctx context.Context, fn func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = fn()
		if last != nil && (strings.Contains(last.Error(), "503") || strings.Contains(last.Error(), "unavailable") ||
			strings.Contains(last.Error(), "connection refused") || strings.Contains(last.Error(), "initializing")) {
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%v (last: %v)", err, last)
	}
	return last
}
