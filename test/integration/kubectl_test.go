package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// kubectl runs bin/kubectl, built from k8s.io/kubectl by hack/build-kubectl.sh.
type kubectl struct {
	bin, kubeconfig string
	// cacheDir is kubectl's discovery and HTTP cache, in the test's
	// temporary directory: without it kubectl writes to $HOME/.kube/cache.
	cacheDir string
}

func newKubectl(t testing.TB, s *testServer) kubectl {
	t.Helper()
	return kubectl{bin: testkit.BuildTool(t, "build-kubectl.sh", "kubectl"), kubeconfig: s.Kubeconfig, cacheDir: t.TempDir()}
}

// command is a kubectl command line with args.
func (k kubectl) command(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", k.kubeconfig, "--cache-dir", k.cacheDir}, args...)...)
}

func (k kubectl) run(t testing.TB, args ...string) string {
	t.Helper()
	cmd := k.command(context.Background(), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String() + stderr.String()
}

func mustContain(t testing.TB, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestKubectl runs a real kubectl against the standalone server and
// through the kube-aggregator in front of the aggregated one.
func TestKubectl(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) *testServer
	}{
		{"standalone", func(t *testing.T) *testServer { return startServer(t, t.TempDir()) }},
		{"aggregated", func(t *testing.T) *testServer { return startAggregated(t).Front }},
	} {
		t.Run(tc.name, func(t *testing.T) { testKubectl(t, tc.start(t)) })
	}
}

func testKubectl(t *testing.T, s *testServer) {
	k := newKubectl(t, s)
	examples, _ := filepath.Abs("../../artifacts/examples")

	t.Run("api-resources", func(t *testing.T) {
		out := k.run(t, "api-resources", "--api-group=fleet.example.com")
		mustContain(t, out, "assignments", "asg", "fleet.example.com/v1beta1", "true", "Assignment",
			"agents", "agt", "false", "Agent")
	})

	t.Run("writes nothing to HOME", func(t *testing.T) {
		// make test must leave the developer's $HOME alone: kubectl's
		// discovery cache goes to the test's --cache-dir.
		home := t.TempDir()
		cmd := k.command(context.Background(), "get", "asg", "-A")
		cmd.Env = append(os.Environ(), "HOME="+home)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl get: %v\n%s", err, out)
		}
		if entries, _ := os.ReadDir(home); len(entries) > 0 {
			t.Errorf("kubectl wrote %v into HOME", entries)
		}
		if entries, _ := os.ReadDir(k.cacheDir); len(entries) == 0 {
			t.Errorf("kubectl's --cache-dir %s is empty: its cache went somewhere else", k.cacheDir)
		}
	})

	mustContain(t, k.run(t, "create", "-f", examples),
		"agent.fleet.example.com/agent-eu-1 created", "assignment.fleet.example.com/nightly-report created")

	t.Run("get -A prints the table columns", func(t *testing.T) {
		out := k.run(t, "get", "assignments", "-A")
		mustContain(t, out, "NAMESPACE", "NAME", "AGENT", "PHASE", "PRIORITY", "AGE",
			"build-1234", "agent-eu-1", "Pending", "nightly-report", "agent-us-1")
		mustContain(t, k.run(t, "get", "agt"), "ZONE", "READY", "eu-west-1a", "Unknown")
		mustContain(t, k.run(t, "get", "fleet", "-A"), "agent.fleet.example.com/agent-us-1", "assignment.fleet.example.com/build-1234")
	})

	t.Run("chunk-size pages through the cache", func(t *testing.T) {
		createMany(t, s, "chunks", "c", 9)
		out := k.run(t, "get", "asg", "-n", "chunks", "--chunk-size=2", "-v=6")
		mustContain(t, out, "limit=2", "continue=", "c-0000", "c-0008")
	})

	t.Run("-o yaml", func(t *testing.T) {
		mustContain(t, k.run(t, "get", "asg", "build-1234", "-o", "yaml"),
			"apiVersion: fleet.example.com/v1beta1", "kind: Assignment", "agentName: agent-eu-1", "phase: Pending")
	})

	t.Run("apply --server-side merges conditions", func(t *testing.T) {
		manifest := writeManifest(t, `apiVersion: fleet.example.com/v1beta1
kind: Agent
metadata:
  name: agent-eu-1
status:
  conditions:
  - type: Ready
    status: "True"
    reason: Heartbeat
    message: ok
    lastTransitionTime: "2026-11-22T00:00:00Z"
`)
		mustContain(t, k.run(t, "apply", "--server-side", "--subresource=status", "--field-manager=agent", "-f", manifest),
			"agent.fleet.example.com/agent-eu-1 serverside-applied")
		mustContain(t, k.run(t, "get", "agt", "agent-eu-1"), "True")
		mustContain(t, k.run(t, "apply", "--server-side", "-f", filepath.Join(examples, "assignment-build.yaml")),
			"assignment.fleet.example.com/build-1234 serverside-applied")
	})

	t.Run("explain", func(t *testing.T) {
		mustContain(t, k.run(t, "explain", "assignment.spec"), "agentName", "-required-", "priority")
		mustContain(t, k.run(t, "explain", "agents.status.conditions"), "type")
	})

	t.Run("get --watch --output-watch-events", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := k.command(ctx, "get", "asg", "-n", "watched", "--watch", "--output-watch-events")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		lines := linesOf(stdout)
		// The watch is established once its header (no objects yet) or a
		// first event prints; create a marker object to learn that.
		createMany(t, s, "watched", "marker", 1)
		expect := func(prefix, name string) {
			t.Helper()
			for {
				select {
				case line, ok := <-lines:
					if !ok {
						t.Fatalf("kubectl exited before %s %s", prefix, name)
					}
					if strings.HasPrefix(line, prefix) && strings.Contains(line, name) {
						return
					}
				case <-ctx.Done():
					t.Fatalf("no %s %s from kubectl --watch", prefix, name)
				}
			}
		}
		expect("ADDED", "marker-0000")
		k.run(t, "create", "-f", writeManifest(t, `apiVersion: fleet.example.com/v1beta1
kind: Assignment
metadata: {name: build-1234, namespace: watched}
spec: {agentName: agent-eu-1}
`))
		expect("ADDED", "build-1234")
		k.run(t, "patch", "asg", "build-1234", "-n", "watched", "--type=merge", "-p", `{"spec":{"priority":99}}`)
		expect("MODIFIED", "build-1234")
		k.run(t, "delete", "asg", "build-1234", "-n", "watched")
		expect("DELETED", "build-1234")
	})

	t.Run("delete", func(t *testing.T) {
		mustContain(t, k.run(t, "delete", "-f", examples), `"nightly-report" deleted`, `"agent-us-1" deleted`)
		mustContain(t, k.run(t, "get", "asg", "-n", "default"), "No resources found")
	})
}

func writeManifest(t testing.TB, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
