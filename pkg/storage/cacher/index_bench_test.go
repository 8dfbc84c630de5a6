package cacher

import (
	"context"
	"fmt"
	"math/bits"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/sharding"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

// The index benchmarks measure what a watcher costs an event that does
// not concern it: nothing, once the dispatcher finds watchers through an
// index instead of walking them all.

// BenchmarkNonMatchingWatchers opens N watches that no write concerns, and
// one watch on everything that tells when the writes have been
// dispatched. 3,000 creates go as fast as etcd takes them. The watches are
// single-object ones (by=name), as agents each on their own object, or
// on the whole resource with a label selector for one agent (by=label),
// which the index does not narrow. It reports process CPU per write
// (cpu-us/event) and, at the largest N, its growth over N = 1,000
// measured in the same run (cpu-growth): for single-object watches it
// should stay near 1, as the index skips the watchers an event does not
// concern.
func BenchmarkNonMatchingWatchers(b *testing.B) {
	const writes = 3000
	e := newBenchEtcd(b)
	for _, by := range []string{"name", "label"} {
		b.Run("by="+by, func(b *testing.B) {
			first := map[string]float64{}
			sizes := []int{1000, 10000, 100000}
			for _, n := range sizes {
				b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
					impls := benchImpls[:2]
					if by == "label" {
						// Upstream has no label index either, and offers each
						// event to 100,000 goroutines: minutes a run.
						impls = impls[:1]
					}
					for _, impl := range impls {
						b.Run(impl.name, func(b *testing.B) {
							for range b.N {
								raw, prefix := e.store(b)
								s := impl.wrap(b, raw, prefix, false)
								cpu := nonMatchingRun(b, e, s, prefix, by, n, writes)
								perEvent := float64(cpu.Microseconds()) / writes
								b.ReportMetric(perEvent, "cpu-us/event")
								if n == sizes[0] {
									first[impl.name] = perEvent
								} else if n == sizes[len(sizes)-1] && first[impl.name] > 0 {
									b.ReportMetric(perEvent/first[impl.name], "cpu-growth")
								}
							}
						})
					}
				})
			}
		})
	}
}

// nonMatchingRun opens n watches of objects that never exist and one on
// everything, has the etcd child write writes pods, and returns the
// process CPU from the first write until the watch on everything has them all.
func nonMatchingRun(b *testing.B, e *benchEtcd, s storage.Interface, prefix, by string, n, writes int) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rv, err := s.GetCurrentResourceVersion(ctx)
	if err != nil {
		b.Fatal(err)
	}
	from := strconv.FormatUint(rv, 10)
	agents := make([]watch.Interface, n)
	for i := range agents {
		name := fmt.Sprintf("agent-%06d", i)
		key, opts := prefix+"ns/"+name, storage.ListOptions{ResourceVersion: from, Predicate: storage.SelectionPredicate{
			Label: labels.Everything(), Field: fields.OneTermEqualSelector("metadata.name", name), GetAttrs: podAttrs}}
		if by == "label" {
			key, opts.Recursive = prefix, true
			opts.Predicate = storage.SelectionPredicate{Label: labels.SelectorFromSet(labels.Set{"agent": name}),
				Field: fields.Everything(), GetAttrs: podAttrs}
		}
		if agents[i], err = s.Watch(ctx, key, opts); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		for _, w := range agents {
			w.Stop()
		}
	}()
	all, err := s.Watch(ctx, prefix, storage.ListOptions{ResourceVersion: from, Recursive: true, Predicate: storage.Everything})
	if err != nil {
		b.Fatal(err)
	}
	defer all.Stop()
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		got := 0
		for ev := range all.ResultChan() {
			if ev.Type == watch.Added {
				if got++; got == writes {
					return
				}
			}
		}
	}()
	start := processCPU()
	if err := e.write(benchWrite{prefix: prefix, writes: writes, watchers: 1}, func(int, int64) {}); err != nil {
		b.Fatal(err)
	}
	select {
	case <-dispatched:
	case <-time.After(2 * time.Minute):
		b.Fatal("the writes were not all dispatched in 2 minutes")
	}
	return processCPU() - start
}

// BenchmarkShardedWatchers opens 10,000 watches, each on one of 640 equal
// ranges of the UID hash space (about 16 on each), as sharded controllers'
// informers, and writes 1,000 pods at 100/s. Each pod concerns the
// watchers of one range. It reports process CPU per write, the events
// delivered, and those missed: expected by a watcher's range and not
// received, or cut off by a closed watch.
func BenchmarkShardedWatchers(b *testing.B) {
	featuregatetesting.SetFeatureGateDuringTest(b, utilfeature.DefaultFeatureGate, features.ShardedListAndWatch, true)
	const watchers, ranges, writes = 10_000, 640, 1000
	e := newBenchEtcd(b)
	for _, impl := range benchImpls[:2] {
		b.Run(impl.name, func(b *testing.B) {
			for range b.N {
				raw, prefix := e.store(b)
				s := impl.wrap(b, raw, prefix, false)
				r := shardedRun(b, e, s, prefix, watchers, ranges, writes)
				b.ReportMetric(float64(r.cpu.Microseconds())/writes, "cpu-us/event")
				b.ReportMetric(float64(r.delivered), "delivered")
				b.ReportMetric(float64(r.missed), "missed")
				b.ReportMetric(float64(r.closed), "closed")
			}
		})
	}
}

type shardedResult struct {
	cpu                       time.Duration
	delivered, missed, closed int64
}

// shardRange returns the i-th of n equal ranges of the hash space, as a
// selector's bounds.
func shardRange(i, n int) (start, end string) {
	bound := func(i int) string {
		if i == n {
			return "0x10000000000000000"
		}
		q, _ := bits.Div64(uint64(i), 0, uint64(n)) // i·2^64/n
		return fmt.Sprintf("0x%016x", q)
	}
	return bound(i), bound(i + 1)
}

func shardedRun(b *testing.B, e *benchEtcd, s storage.Interface, prefix string, watchers, ranges, writes int) shardedResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rv, err := s.GetCurrentResourceVersion(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// What each range expects: the writes whose UID hashes into it.
	expected := make([]int64, ranges)
	for i := range writes {
		q, _ := bits.Mul64(shard.Hash(string(benchUID(i))), uint64(ranges))
		expected[q]++
	}
	var res shardedResult
	var received atomic.Int64
	cs := newConsumers()
	for i := range watchers {
		start, end := shardRange(i%ranges, ranges)
		pred := storage.Everything
		pred.ShardSelector = sharding.NewSelector(sharding.ShardRangeRequirement{Key: shard.UIDPath, Start: start, End: end})
		w, err := s.Watch(ctx, prefix, storage.ListOptions{ResourceVersion: strconv.FormatUint(rv, 10), Recursive: true, Predicate: pred})
		if err != nil {
			b.Fatal(err)
		}
		cs.consume(b, w, int(expected[i%ranges]), func(ev watch.Event) {
			if ev.Type == watch.Added {
				received.Add(1)
			}
		})
	}
	start := processCPU()
	if err := e.write(benchWrite{prefix: prefix, writes: writes, watchers: 1, rate: 100}, func(int, int64) {}); err != nil {
		b.Fatal(err)
	}
	cs.finish(2 * time.Minute)
	res.cpu = processCPU() - start
	var want int64
	for i := range watchers {
		want += expected[i%ranges]
	}
	res.delivered, res.closed = received.Load(), cs.closed.Load()
	res.missed = want - res.delivered
	return res
}
