package integration

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRestartKeepsData stops the server and its embedded etcd, starts a new
// one on the same data directory and reads the object back.
func TestRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, dir)
	created, err := s.Client.FleetV1beta1().Assignments(ns).Create(context.Background(), newAssignment("survivor", "agent-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.stop()

	s2 := startServer(t, dir)
	got, err := s2.Client.FleetV1beta1().Assignments(ns).Get(context.Background(), "survivor", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != created.UID || got.ResourceVersion != created.ResourceVersion {
		t.Fatalf("after restart got uid=%s rv=%s, want uid=%s rv=%s", got.UID, got.ResourceVersion, created.UID, created.ResourceVersion)
	}
}
