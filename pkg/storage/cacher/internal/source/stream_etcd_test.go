package source

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cached-apiserver/cached-apiserver/internal/embedetcd"
)

// TestOwnStreamHearsNoEarlyProgress shows, on a real etcd, the hazard
// streamContext avoids. Beside a synced watch, progress is requested again
// and again on the stream of the newest watch, as the cache does, while
// new watches open from a revision just written. A watch that shares a
// stream with the other one can hear a notification at or past that
// revision before the event at it; a watch on a stream of its own never
// does.
func TestOwnStreamHearsNoEarlyProgress(t *testing.T) {
	e, url, err := embedetcd.Start(embedetcd.Config{Dir: t.TempDir(), Throwaway: true})
	if err != nil {
		t.Fatal(err)
	}
	// Stopped before its directory is removed (cleanups run last first).
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	f := newFollower(Config{GroupResource: schema.GroupResource{Resource: "pods"}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shared := clientv3.WithRequireLeader(f.streamContext(ctx))
	for range cli.Watch(shared, "/other/", clientv3.WithCreatedNotify()) {
		break // Created: etcd holds it, synced.
	}

	// The newest watch's context, which progress is requested on.
	var newest atomic.Pointer[context.Context]
	newest.Store(&shared)
	var wg sync.WaitGroup
	defer wg.Wait()
	hammer, stop := context.WithCancel(ctx)
	defer stop()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for hammer.Err() == nil {
			_ = cli.RequestProgress(*newest.Load())
		}
	}()

	// early opens a watch from a revision just written, and reports
	// whether it heard a notification at or past it before the event.
	early := func(i int, wctx context.Context) bool {
		t.Helper()
		r, err := cli.Put(ctx, fmt.Sprintf("/pods/%d", i), "v")
		if err != nil {
			t.Fatal(err)
		}
		wctx, stopWatch := context.WithCancel(wctx)
		defer stopWatch()
		newest.Store(&wctx)
		resp, ok := <-cli.Watch(wctx, "/pods/", clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision))
		if !ok || resp.Err() != nil {
			t.Fatalf("watch %d ended: %v", i, resp.Err())
		}
		return resp.IsProgressNotify() && resp.Header.Revision >= r.Header.Revision
	}
	// Sharing: 26 of 330 heard one early in a run; give it up to 30 s.
	seen, i := false, 0
	for ; !seen && ctx.Err() == nil; i++ {
		seen = early(i, shared)
	}
	if !seen {
		t.Fatal("no watch sharing a stream heard a notification before its event: this test cannot tell")
	}
	t.Logf("watch %d sharing a stream heard a notification before its event", i)
	for i := range 50 {
		if early(1000+i, clientv3.WithRequireLeader(f.streamContext(ctx))) {
			t.Fatalf("watch %d, on a stream of its own, heard a progress notification before its first event", i)
		}
	}
}
