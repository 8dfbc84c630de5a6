package integration

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
)

// TestExternalEtcd points the server at an etcd it did not start, with
// --etcd-servers, and finds the objects under the server's prefix there.
func TestExternalEtcd(t *testing.T) {
	client := testserver.RunEtcd(t, nil)
	endpoint := client.Endpoints()[0]
	s := startServer(t, t.TempDir(), "--etcd-servers", endpoint)
	if s.EtcdEndpoint != endpoint {
		t.Fatalf("server uses etcd %s, want the external %s", s.EtcdEndpoint, endpoint)
	}
	if _, err := s.Client.FleetV1beta1().Assignments(ns).Create(context.Background(), newAssignment("outside", "agent-a"),
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := client.KV.Get(context.Background(), "/registry/fleet.example.com/assignments/default/outside")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || !strings.Contains(string(resp.Kvs[0].Value), "agent-a") {
		t.Fatalf("the external etcd does not hold the assignment: %v", resp.Kvs)
	}
}
