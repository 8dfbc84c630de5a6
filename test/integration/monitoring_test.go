package integration

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// TestMonitoringMetricsExist checks artifacts/monitoring against a running
// server: hack/promql parses every expression of the alert rules and the
// dashboard with Prometheus' own parser and lists the metrics they
// select, and each must be among the samples the server's /metrics
// serves once it has served a create, a list and a watch. A renamed
// metric, or a typo in a panel, fails here rather than on a blank panel
// or an alert that can never fire.
func TestMonitoringMetricsExist(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", ".",
		"-rules", filepath.Join(root, "artifacts/monitoring/alerts.yaml"),
		"-dashboard", filepath.Join(root, "artifacts/monitoring/dashboard.json"))
	cmd.Dir = filepath.Join(root, "hack/promql")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/promql: %v\n%s", err, stderr.String())
	}
	names := strings.Fields(string(out))
	if len(names) < 10 {
		t.Fatalf("hack/promql found only %v", names)
	}

	s := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := s.Client.FleetV1beta1().Assignments("monitored")
	w, err := client.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := client.Create(ctx, &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: "a"},
		Spec: v1beta1.AssignmentSpec{AgentName: "agent-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, w, func(ev watch.Event) bool { return ev.Type == watch.Added }, "the watch")
	if _, err := client.List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}

	served := scrapeSampleNames(t, s.Config)
	for _, name := range names {
		if !served[name] {
			t.Errorf("artifacts/monitoring uses %s, which the server does not serve", name)
		}
	}
}

// scrapeSampleNames returns the names of the samples /metrics serves.
func scrapeSampleNames(t testing.TB, cfg *rest.Config) map[string]bool {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(cfg.Host + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %d %s", resp.StatusCode, body)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}
