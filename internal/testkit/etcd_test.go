package testkit

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
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
