package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// TestEncryptionAtRest: with --encryption-provider-config, etcd holds only
// ciphertext, and the cache, which keeps each object as bytes it read
// through the storage's transformer, gives clients plaintext in gets,
// lists and watches; after a restart too, when the cache fills its
// history from etcd's (warm start) and a watch resumes from before it.
func TestEncryptionAtRest(t *testing.T) {
	for _, provider := range []string{"aescbc", "secretbox"} {
		t.Run(provider, func(t *testing.T) {
			dir := t.TempDir()
			config := filepath.Join(dir, "encryption.yaml")
			key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{byte(len(provider))}, 32))
			writeFile(t, config, []byte(fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [assignments.fleet.example.com]
  providers:
  - %s:
      keys:
      - name: key1
        secret: %s
`, provider, key)))
			// The warm start is on by default.
			flags := []string{"--encryption-provider-config", config}
			s := startServer(t, filepath.Join(dir, "data"), flags...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			assignments := s.Client.FleetV1beta1().Assignments(ns)

			secret := "plaintext-" + provider
			created, err := assignments.Create(ctx, newAssignment("sealed", "agent-1"), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			w, err := assignments.Watch(ctx, metav1.ListOptions{ResourceVersion: created.ResourceVersion})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			created.Spec.Payload = secret
			updated, err := assignments.Update(ctx, created, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}

			// etcd holds the provider's envelope and no plaintext.
			resp, err := s.etcdClient(t).Get(ctx, "/registry/fleet.example.com/assignments/"+ns+"/sealed")
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("etcd get: %v, %d values", err, len(resp.Kvs))
			}
			stored := resp.Kvs[0].Value
			if prefix := "k8s:enc:" + provider + ":v1:key1:"; !bytes.HasPrefix(stored, []byte(prefix)) || bytes.Contains(stored, []byte(secret)) ||
				bytes.Contains(stored, []byte("agent-1")) {
				t.Fatalf("etcd holds %q…; want it to begin with %q and hold no plaintext", stored[:min(len(stored), 60)], prefix)
			}

			// The cache's event, get and lists are plaintext.
			if ev := next(t, w); ev.Type != watch.Modified || ev.Object.(*v1beta1.Assignment).Spec.Payload != secret {
				t.Errorf("watch: %s with payload %q; want MODIFIED with %q", ev.Type, payloadOf(ev.Object), secret)
			}
			readsPlaintext(ctx, t, s, updated.ResourceVersion, secret)

			// After a restart, the warm start replays etcd's history through
			// the same transformer: a watch from before the update gets it.
			s.stop()
			s = startServer(t, filepath.Join(dir, "data"), flags...)
			w, err = s.Client.FleetV1beta1().Assignments(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: created.ResourceVersion})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			if ev := next(t, w); ev.Type != watch.Modified || ev.Object.(*v1beta1.Assignment).Spec.Payload != secret {
				t.Errorf("watch after the restart: %s with payload %q; want MODIFIED with %q", ev.Type, payloadOf(ev.Object), secret)
			}
			readsPlaintext(ctx, t, s, updated.ResourceVersion, secret)
		})
	}
}

// readsPlaintext checks that a get and lists (from the cache, any state,
// and a consistent one) give the Assignment sealed in ns with payload
// want, at rv.
func readsPlaintext(ctx context.Context, t testing.TB, s *testServer, rv, want string) {
	t.Helper()
	assignments := s.Client.FleetV1beta1().Assignments(ns)
	got, err := assignments.Get(ctx, "sealed", metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Payload != want || got.ResourceVersion != rv {
		t.Errorf("get: payload %q at %s; want %q at %s", got.Spec.Payload, got.ResourceVersion, want, rv)
	}
	for _, opts := range []metav1.ListOptions{{ResourceVersion: "0"}, {}} {
		list, err := assignments.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 || list.Items[0].Spec.Payload != want || list.Items[0].ResourceVersion != rv {
			var payloads []string
			for _, a := range list.Items {
				payloads = append(payloads, a.Spec.Payload+"@"+a.ResourceVersion)
			}
			t.Errorf("list at %q: %s; want one payload %q at %s", opts.ResourceVersion, strings.Join(payloads, ", "), want, rv)
		}
	}
}

// payloadOf returns obj's payload, or what obj is if it is no Assignment.
func payloadOf(obj any) string {
	if a, ok := obj.(*v1beta1.Assignment); ok {
		return a.Spec.Payload
	}
	return fmt.Sprintf("%T", obj)
}
