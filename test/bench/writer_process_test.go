package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// The writes timed beside watch-lists come from a process of their own, as
// a controller's would. In this one, the goroutines reading a hundred
// watch-lists, each decompressing and scanning megabytes, queue a writer
// goroutine behind them on the two cores: a put straight to etcd from this
// process, which the server takes no part in, had a p99 of 171 ms beside
// watch-lists of 10 KiB objects, while the server's own scheduler latency
// p99.9 was 10.5 ms (BENCH_PROBES). The figure then grew as the server sent
// the watch-lists faster. A process of its own gets the CPU when it wakes,
// as the server's writes do.

// writerKubeconfig, in a writer process's environment, is the server's
// kubeconfig; writerMax, how many writes to make at most.
const (
	writerKubeconfig = "BENCH_WRITER_KUBECONFIG"
	writerMax        = "BENCH_WRITER_MAX"
)

// runWriterProcess, in a writer process, creates an Assignment every 10 ms
// until it made BENCH_WRITER_MAX or its standard input closes, writes each
// create's time in nanoseconds to standard output, a line each, and exits.
// Anywhere else it returns.
func runWriterProcess() {
	kubeconfig := os.Getenv(writerKubeconfig)
	if kubeconfig == "" {
		return
	}
	if err := writeEvery10ms(kubeconfig, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func writeEvery10ms(kubeconfig string, stdin io.Reader, stdout io.Writer) error {
	max, err := strconv.Atoi(os.Getenv(writerMax))
	if err != nil {
		return fmt.Errorf("%s: %w", writerMax, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = -1, -1 // unthrottled, as the benchmark's other clients
	client, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(stop)
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	ctx := context.Background()
	for range max {
		select {
		case <-stop:
			return nil
		case <-tick.C:
		}
		a := &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{GenerateName: "w-", Namespace: "writes"},
			Spec: v1beta1.AssignmentSpec{AgentName: "agent-w"}}
		t0 := time.Now()
		if _, err := client.FleetV1beta1().Assignments("writes").Create(ctx, a, metav1.CreateOptions{}); err != nil {
			return err
		}
		// Unbuffered, so that the parent knows when the writes began.
		if _, err := fmt.Fprintln(stdout, time.Since(t0).Nanoseconds()); err != nil {
			return err
		}
	}
	return nil
}

// writesFrom runs a writer process against the server behind kubeconfig
// until it made max writes or stop closes, and returns each write's time.
// It closes writing, if set, once the first write is made.
func writesFrom(ctx context.Context, b *testing.B, kubeconfig string, stop <-chan struct{}, max int, writing chan<- struct{}) []time.Duration {
	var stderr bytes.Buffer
	child := testkit.StartChild(b, &stderr, writerKubeconfig+"="+kubeconfig, writerMax+"="+strconv.Itoa(max))
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
		case <-done:
		case <-ctx.Done():
		}
		child.Stdin.Close()
	}()
	var took []time.Duration
	lines := bufio.NewScanner(child.Stdout)
	for lines.Scan() {
		ns, err := strconv.ParseInt(lines.Text(), 10, 64)
		if err != nil {
			b.Fatalf("writer process: %q", lines.Text())
		}
		took = append(took, time.Duration(ns))
		if writing != nil && len(took) == 1 {
			close(writing)
		}
	}
	if err := child.Cmd.Wait(); err != nil {
		b.Fatalf("writer process: %v: %s", err, testkit.Tail(stderr.Bytes(), 2000))
	}
	return took
}
