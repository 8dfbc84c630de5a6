package bench

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// BenchmarkEtcdRanges measures what etcd spends serving a resource's
// objects to a list in each shape a cache can read them: RANGES_OBJECTS
// (1,000,000) Assignments of 1 KiB loaded as bench-million loads them,
// then etcd's own CPU (from /proc) for each shape, twice:
//   - the keys without values in pages of 10,000 (a Get with a limit,
//     each page to the resource's end), and as one keys-only stream;
//   - the values in pages of 10,000, each a stream with a limit to the
//     resource's end (the etcd3 store's paged list), and each a stream
//     over the page's own keys (the cache's, internal/source/ranges.go);
//   - the values as one stream.
//
// A read with a limit makes etcd count every key from the page to its
// range's end, which the shapes without one do not: the cause of a start
// at a million taking twice as long (docs/benchmarks.md, A million
// objects).
func BenchmarkEtcdRanges(b *testing.B) {
	ctx := context.Background()
	d := directLoadFor("RANGES", testkit.EnvInt("RANGES_OBJECTS", 1000000))
	cluster := startEtcdCluster(b, b.TempDir(), d.etcdFlags()...)
	etcd := etcdClient(b, cluster.Endpoints()[0])
	d.run(ctx, b, etcd)
	pid := cluster.Procs[0].Pid()
	end := clientv3.GetPrefixRangeEnd(assignmentsKey)
	const page = 10000
	var starts []string
	for from := assignmentsKey; ; {
		r, err := etcd.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(page))
		if err != nil {
			b.Fatal(err)
		}
		starts = append(starts, from)
		if !r.More {
			break
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
	head, err := etcd.Get(ctx, "none")
	if err != nil {
		b.Fatal(err)
	}
	rev := head.Header.Revision
	stream := func(from string, opts ...clientv3.OpOption) {
		ch, err := etcd.GetStream(ctx, from, append(opts, clientv3.WithRev(rev))...)
		if err != nil {
			b.Fatal(err)
		}
		for r := range ch {
			if r.Err() != nil {
				b.Fatal(r.Err())
			}
		}
	}
	shapes := []struct {
		name string
		read func()
	}{
		{"keys-paged", func() {
			for _, from := range starts {
				if _, err := etcd.Get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithKeysOnly(), clientv3.WithLimit(page)); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"keys-stream", func() { stream(assignmentsKey, clientv3.WithRange(end), clientv3.WithKeysOnly()) }},
		{"values-paged-to-end", func() {
			for _, from := range starts {
				stream(from, clientv3.WithRange(end), clientv3.WithLimit(page))
			}
		}},
		{"values-page-ranges", func() {
			for i, from := range starts {
				to := end
				if i+1 < len(starts) {
					to = starts[i+1]
				}
				stream(from, clientv3.WithRange(to))
			}
		}},
		{"values-stream", func() { stream(assignmentsKey, clientv3.WithRange(end)) }},
	}
	cpu := map[string][]time.Duration{}
	for range 2 {
		for _, s := range shapes {
			before, _ := procStats(b, pid)
			s.read()
			after, _ := procStats(b, pid)
			cpu[s.name] = append(cpu[s.name], after-before)
		}
	}
	for _, s := range shapes {
		b.ReportMetric(float64(min(cpu[s.name][0], cpu[s.name][1]).Milliseconds()), s.name+"-etcd-cpu-ms")
	}
}
