package embedetcd

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStartServesOnLoopback(t *testing.T) {
	e, endpoint, err := Start(Config{Dir: t.TempDir(), Throwaway: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if !strings.HasPrefix(endpoint, "http://127.0.0.1:") {
		t.Fatalf("endpoint %q is not on loopback", endpoint)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" {
		t.Fatalf("Get(/k) = %v, want v", got.Kvs)
	}
}
