package cacher

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/internal/embedetcd"
	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// benchEtcdEnv, set in the environment, makes this test binary run an etcd
// instead of tests. The benchmarks start it as a child process, so that
// the CPU and memory they measure are the caches' (and the writer's and
// watchers', which every implementation shares), not etcd's.
const benchEtcdEnv = "CACHER_BENCH_ETCD"

// benchEtcd is one etcd process, which also does the runs' writes; each
// run stores under its own prefix.
type benchEtcd struct {
	client *kubernetes.Client
	runs   int
	// stdin takes write commands; out answers them.
	stdin io.WriteCloser
	out   *bufio.Reader
}

// benchWrite asks the child to create writes pods (benchPod) under prefix,
// at rate per second, or as fast as etcd takes them when rate is 0.
type benchWrite struct {
	prefix           string
	writes, watchers int
	rate             float64
}

// write has the child do w, calling done with each write's index and the
// wall-clock time it returned, and returns when all are done.
func (e *benchEtcd) write(w benchWrite, done func(i int, at int64)) error {
	if _, err := fmt.Fprintf(e.stdin, "write %s %d %d %g\n", w.prefix, w.writes, w.watchers, w.rate); err != nil {
		return err
	}
	for {
		line, err := e.out.ReadString('\n')
		if err != nil {
			return fmt.Errorf("etcd child: %w", err)
		}
		var i int
		var at int64
		switch {
		case line == "end\n":
			return nil
		case strings.HasPrefix(line, "done "):
			if _, err := fmt.Sscanf(line, "done %d %d", &i, &at); err != nil {
				return fmt.Errorf("etcd child said %q: %w", line, err)
			}
			done(i, at)
		default:
			return fmt.Errorf("etcd child: %s", line)
		}
	}
}

// newBenchEtcd starts this binary as an etcd child that lives until the
// benchmark ends.
func newBenchEtcd(b *testing.B) *benchEtcd {
	klog.SetLogger(klog.Background().V(10)) // quiet
	child := testkit.StartChild(b, os.Stderr, benchEtcdEnv+"="+b.TempDir())
	b.Cleanup(func() {
		child.Stdin.Close() // the child exits
		_ = child.Cmd.Wait()
	})
	out := bufio.NewReader(child.Stdout)
	line, err := out.ReadString('\n')
	endpoint, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	if err != nil || !ok {
		b.Fatalf("etcd child did not start: %q %v", line, err)
	}
	client, err := kubernetes.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 20 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	return &benchEtcd{client: client, stdin: child.Stdin, out: out}
}

// runBenchEtcd is the child: an etcd on free loopback ports in dir, until
// stdin closes. It prints "ready <client URL>" once it serves.
func runBenchEtcd(dir string) int {
	e, endpoint, err := embedetcd.Start(embedetcd.Config{Dir: dir, Throwaway: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer e.Close()
	c, err := kubernetes.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 20 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready", endpoint)
	out.Flush()
	commands := bufio.NewScanner(os.Stdin)
	for commands.Scan() {
		var w benchWrite
		if _, err := fmt.Sscanf(commands.Text(), "write %s %d %d %g", &w.prefix, &w.writes, &w.watchers, &w.rate); err != nil {
			fmt.Fprintln(out, "error", err)
		} else if err := doWrites(c, w, out); err != nil {
			fmt.Fprintln(out, "error", err)
		} else {
			fmt.Fprintln(out, "end")
		}
		out.Flush()
	}
	return 0
}

// doWrites is the child's side of benchEtcd.write.
func doWrites(c *kubernetes.Client, w benchWrite, out *bufio.Writer) error {
	s, stop, err := newRawStore(c, w.prefix)
	if err != nil {
		return err
	}
	defer stop()
	var interval time.Duration
	if w.rate > 0 {
		interval = time.Duration(float64(time.Second) / w.rate)
	}
	start := time.Now()
	for i := 0; i < w.writes; i++ {
		if interval > 0 {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d) // pacing the fixed write rate
			}
		}
		pod := benchPod(i, w.watchers)
		if err := s.Create(context.Background(), w.prefix+"ns/"+pod.Name, pod, &example.Pod{}, 0); err != nil {
			return err
		}
		fmt.Fprintln(out, "done", i, time.Now().UnixNano())
		out.Flush()
	}
	return nil
}
