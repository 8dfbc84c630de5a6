package cacher

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/utils/ptr"
)

// BenchmarkAgentWatchLists: 20,000 pods over 1,000 nodes, then 1,000
// watch-lists at once, one per node (spec.nodeName, the trigger field),
// as agents starting together: each gets its node's 20 pods and the
// initial-events-end bookmark. Reports, per watch-list, the wall time of
// the whole storm and the process CPU.
func BenchmarkAgentWatchLists(b *testing.B) {
	const pods, nodes = 20_000, 1_000
	e := newBenchEtcd(b)
	for _, impl := range benchImpls[:2] {
		b.Run(impl.name, func(b *testing.B) {
			for range b.N {
				raw, prefix := e.store(b)
				if err := e.write(benchWrite{prefix: prefix, writes: pods, watchers: nodes}, func(int, int64) {}); err != nil {
					b.Fatal(err)
				}
				s := impl.wrap(b, raw, prefix, true)
				cpu, start := processCPU(), time.Now()
				var wg sync.WaitGroup
				for i := range nodes {
					wg.Add(1)
					go func() {
						defer wg.Done()
						agentWatchList(b, s, prefix, benchNode(i, nodes), pods/nodes)
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(time.Since(start).Microseconds())/nodes, "wall-us/watch-list")
				b.ReportMetric(float64((processCPU()-cpu).Microseconds())/nodes, "cpu-us/watch-list")
			}
		})
	}
}

// agentWatchList runs one watch-list for node's pods and checks it got
// want of them before the initial-events-end bookmark.
func agentWatchList(b *testing.B, s storage.Interface, prefix, node string, want int) {
	pred := storage.SelectionPredicate{Label: labels.Everything(), Field: fields.OneTermEqualSelector("spec.nodeName", node),
		GetAttrs: podAttrs, AllowWatchBookmarks: true}
	w, err := s.Watch(context.Background(), prefix, storage.ListOptions{Recursive: true, Predicate: pred,
		SendInitialEvents: ptr.To(true)})
	if err != nil {
		b.Error(err)
		return
	}
	defer w.Stop()
	added := 0
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Added:
			added++
		case watch.Bookmark:
			if added != want {
				b.Errorf("%s: %d pods before the initial-events-end bookmark, want %d", node, added, want)
			}
			return
		default:
			b.Errorf("%s: %s event during the initial events", node, ev.Type)
			return
		}
	}
	b.Errorf("%s: the watch ended before its initial events", node)
}
