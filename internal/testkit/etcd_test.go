package testkit

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestStartEtcd starts three member processes and checks that they form
// one cluster: a write through one member is read through another.
func TestStartEtcd(t *testing.T) {
	c := StartEtcd(t, EtcdConfig{Bin: Build(t, Etcd)[0], Dir: t.TempDir(), Members: 3})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := func(endpoint string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	first, last := client(c.Endpoints()[0]), client(c.Endpoints()[2])
	if _, err := first.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	got, err := last.Get(ctx, "/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" {
		t.Fatalf("Get(/k) through another member = %v, want v", got.Kvs)
	}
	members, err := last.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members.Members) != 3 {
		t.Fatalf("the cluster has %d members, want 3", len(members.Members))
	}
}

// TestPartition cuts one member off from the other two through their peer
// proxies: the majority goes on writing, the minority cannot serve a
// linearizable read, and after the heal it catches up.
func TestPartition(t *testing.T) {
	c := StartEtcd(t, EtcdConfig{Bin: Build(t, Etcd)[0], Dir: t.TempDir(), Members: 3, PeerProxies: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clients := make([]*clientv3.Client, 3)
	for i, endpoint := range c.Endpoints() {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		clients[i] = cli
	}
	if _, err := clients[1].Put(ctx, "/k", "before"); err != nil {
		t.Fatal(err)
	}

	c.Partition([]int{0}, []int{1, 2})
	// The majority elects a leader if it lost one, and writes.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := clients[1].Put(pctx, "/k", "during")
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the majority never wrote during the partition: %v", err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
	got, err := clients[0].Get(rctx, "/k")
	rcancel()
	if err == nil {
		t.Fatalf("the cut-off member served a linearizable read during the partition: %v", got.Kvs)
	}

	c.HealPartition()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		got, err := clients[0].Get(rctx, "/k")
		return err == nil && len(got.Kvs) == 1 && string(got.Kvs[0].Value) == "during", nil
	}); err != nil {
		t.Fatalf("the member never caught up after the heal: %v", err)
	}
}
