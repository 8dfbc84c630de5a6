// Command etcdorphans measures how often etcd's client leaves a watch on
// etcd when the watch ends as its connection closes: the client, resuming
// the broken stream's watches on a new connection, re-creates the ended
// watch there and never cancels it. It runs an embedded etcd and ends
// -watches watches, each by closing the client's connections and
// cancelling it, at once or -gap apart, and counts those still on etcd
// (etcd_debugging_mvcc_watcher_total) 2 s later, and the goroutines left.
// docs/reliability.md and the cache's silent-watch handling quote it:
//
//	go run ./hack/tools/etcdorphans            # ended as the connection closes
//	go run ./hack/tools/etcdorphans -gap 25ms  # ended 25 ms before, as the cache does
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/cached-apiserver/cached-apiserver/internal/embedetcd"
)

func main() {
	watches := flag.Int("watches", 40, "watches to end")
	gap := flag.Duration("gap", 0, "how long before closing the connection each watch ends; 0: at once")
	flag.Parse()
	if err := run(*watches, *gap); err != nil {
		log.Fatal(err)
	}
}

// conns are the client's connections, closed as a blackhole's would be.
type conns struct {
	// mu guards open.
	mu   sync.Mutex
	open []net.Conn
}

func (c *conns) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		c.mu.Lock()
		c.open = append(c.open, conn)
		c.mu.Unlock()
	}
	return conn, err
}

func (c *conns) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.open {
		_ = conn.Close()
	}
	c.open = nil
}

// watchers is how many watches etcd holds.
func watchers() float64 {
	mfs, _ := prometheus.DefaultGatherer.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "etcd_debugging_mvcc_watcher_total" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func run(n int, gap time.Duration) error {
	dir, err := os.MkdirTemp("", "etcdorphans")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, url, err := embedetcd.Start(embedetcd.Config{Dir: dir, Throwaway: true})
	if err != nil {
		return err
	}
	defer e.Close()
	var cs conns
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(cs.dial)}})
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.Put(context.Background(), "/a", "x"); err != nil {
		return err
	}
	goroutines := runtime.NumGoroutine()
	left := 0
	for i := range n {
		before := watchers()
		// Each on a stream of its own, as the cache's watches are.
		md := metadata.Pairs("watch", fmt.Sprint(i))
		ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
		wch := cli.Watch(ctx, fmt.Sprintf("/w%d/", i), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		<-wch
		if gap > 0 {
			cancel()
			time.Sleep(gap) // The cache's shortest wait before its next watch.
		}
		cs.closeAll()
		cancel()
		for range wch {
		}
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) && watchers() > before {
			time.Sleep(20 * time.Millisecond)
		}
		if watchers() > before {
			left++
		}
	}
	time.Sleep(2 * time.Second) // Let the client settle before counting.
	fmt.Printf("%d of %d watches ended %v before their connection closed stayed on etcd for 2 s; goroutines %d before, %d after\n",
		left, n, gap, goroutines, runtime.NumGoroutine())
	return nil
}
