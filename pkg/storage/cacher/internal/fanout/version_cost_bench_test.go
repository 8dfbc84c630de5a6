package fanout

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// BenchmarkVersionCost measures what the cache holds for an object version
// besides its bytes, by construction rather than through a server's heap,
// where fragmentation and the process move by more than this: the record
// with its key (object-B; the bytes' allocation is taken as their length
// rounded up to its size class, where the key may also be), the store's
// entry and its index entry by the trigger field, 100 values or one an
// object (store-B), and
// a history entry (event-B). Each is the live heap it adds for 20,000 pods
// with an annotation of 1 KiB, as bench-scale's objects have, after a
// collection, an object.
//
//	go test ./pkg/storage/cacher/internal/fanout -run '^$' -bench VersionCost -benchtime 1x -count 3
func BenchmarkVersionCost(b *testing.B) {
	const n = 20_000
	// The pods' nodes, the index's values: shared by 200 pods each, or one
	// a pod, as the values of an index over objects like a real cluster's
	// mostly are (an owner's name).
	for _, nodes := range []struct {
		name string
		n    int
	}{{"shared", 100}, {"unique", n}} {
		b.Run(nodes.name, func(b *testing.B) { versionCost(b, n, nodes.n) })
	}
}

func versionCost(b *testing.B, n, nodes int) {
	for range b.N {
		pods := make([]*example.Pod, n)
		for i := range pods {
			pods[i] = &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%06d", i), Namespace: "ns",
				Labels: map[string]string{"app": "web"}, ResourceVersion: fmt.Sprint(10 + i),
				Annotations: map[string]string{"payload": strings.Repeat("x", 1024)}},
				Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i%nodes)}}
		}
		objecttest.PodObject(pods[0]) // the interner's tables
		start := liveHeap()
		objs := make([]*object.Object, n)
		var raw int64
		for i, pod := range pods {
			objs[i] = objecttest.PodObject(pod)
			raw += int64(allocated(len(objs[i].Raw)))
		}
		built := liveHeap()
		s := store.New[*Event](objecttest.Pods.IndexFuncs())
		s.Replace(objs, 9)
		stored := liveHeap()
		l := history.New[*Event](history.Config{Window: time.Hour, MinSize: n, MaxSize: n})
		l.Reset(9)
		for _, o := range objs {
			l.Append(&Event{Type: watch.Added, Key: o.Key, Rev: o.RV, Cur: o, Seen: time.Now().UnixNano()})
		}
		logged := liveHeap()
		b.ReportMetric(float64(built-start-raw-int64(8*n))/float64(n), "object-B")
		b.ReportMetric(float64(stored-built)/float64(n), "store-B")
		b.ReportMetric(float64(logged-stored)/float64(n), "event-B")
		runtime.KeepAlive(pods)
		runtime.KeepAlive(s)
		runtime.KeepAlive(l)
	}
}

// allocated is what Go allocates for n bytes: n rounded up to its size
// class, as append rounds a slice's capacity.
func allocated(n int) int { return cap(append([]byte(nil), make([]byte, n)...)) }

// liveHeap returns the heap allocated after a collection.
func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
