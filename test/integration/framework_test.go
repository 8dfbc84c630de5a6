// Package integration starts cached-apiserver in-process on loopback, over
// a real embedded etcd, and drives it through the generated clientset and
// raw HTTP.
package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cached-apiserver/cached-apiserver/pkg/cmd/server"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
	fleetv1beta1 "github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned/typed/fleet/v1beta1"
)

// TestMain re-executes the tests with KUBE_WATCHLIST_INCONSISTENCY_DETECTOR
// set, which client-go reads once at start-up: every watch-list informer in
// these tests then checks its result against a list.
func TestMain(m *testing.M) {
	const detector = "KUBE_WATCHLIST_INCONSISTENCY_DETECTOR"
	if os.Getenv(detector) == "" {
		exe, err := os.Executable()
		if err == nil {
			os.Setenv(detector, "true")
			err = syscall.Exec(exe, os.Args, os.Environ())
		}
		fmt.Fprintf(os.Stderr, "cannot re-execute with %s=true: %v\n", detector, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// testServer is one running server and clients for it.
type testServer struct {
	Addr         string
	URL          string
	DataDir      string
	Kubeconfig   string
	Config       *rest.Config
	Client       versioned.Interface
	EtcdEndpoint string

	stop func()
}

// startServer runs a standalone server with its data in dataDir until the
// test ends or stop is called.
func startServer(t testing.TB, dataDir string, flags ...string) *testServer {
	t.Helper()
	return startServerOn(t, "127.0.0.1:0", dataDir, flags...)
}

// startServerOn is startServer on a given address, so that a restarted
// server keeps the URL its clients know.
func startServerOn(t testing.TB, addr, dataDir string, flags ...string) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	inst, stop := runServer(t, ln, append([]string{
		"--data-dir", dataDir,
		"--embedded-etcd-progress-notify-interval", "1s",
		// etcd logs its listeners closing at error level; keep test output readable.
		"--embedded-etcd-log-level", "fatal",
	}, flags...))
	s := &testServer{Addr: ln.Addr().String(), URL: inst.URL, DataDir: dataDir, Kubeconfig: inst.Kubeconfig,
		EtcdEndpoint: inst.EtcdEndpoints[0], stop: stop}
	s.connect(t)
	return s
}

// runServer parses args as the command line does and serves on ln until
// the test ends or stop is called.
func runServer(t testing.TB, ln net.Listener, args []string) (inst *server.Instance, stop func()) {
	t.Helper()
	opts := server.NewOptions(io.Discard)
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse(append(args, "--secure-port", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))); err != nil {
		t.Fatal(err)
	}
	opts.Recommended.SecureServing.Listener = ln

	inst, err := opts.NewInstance()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inst.Run(ctx) }()

	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("server exited with %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("server did not stop within a minute")
		}
	}
	t.Cleanup(stop)
	return inst, stop
}

// connect builds the clients from s.Kubeconfig and waits until the server
// is ready.
func (s *testServer) connect(t testing.TB) {
	t.Helper()
	var err error
	s.Config, err = clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	s.Config.QPS, s.Config.Burst = -1, -1
	s.Client = versioned.NewForConfigOrDie(s.Config)
	waitReady(t, s.Config)
}

// waitReady polls /readyz until the server reports ready.
func waitReady(t testing.TB, cfg *rest.Config) {
	t.Helper()
	rc, err := rest.UnversionedRESTClientFor(withNegotiation(cfg))
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true,
		func(ctx context.Context) (bool, error) {
			res := rc.Get().AbsPath("/readyz").Do(ctx)
			var code int
			res.StatusCode(&code)
			return code == 200, nil
		})
	if err != nil {
		t.Fatalf("server never became ready: %v", err)
	}
}

// withNegotiation returns a copy of cfg that a raw REST client can use.
func withNegotiation(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = nil
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return c
}

// etcdClient connects to the server's etcd.
func (s *testServer) etcdClient(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.EtcdEndpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// linesOf sends each line r holds, as a process prints it, and closes the
// channel at r's end.
func linesOf(r io.Reader) <-chan string {
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines
}

// watchFromList lists, then watches from the list's resourceVersion, as an
// informer does, and stops the watch when the test ends.
func watchFromList(t testing.TB, c fleetv1beta1.AssignmentInterface) watch.Interface {
	t.Helper()
	list, err := c.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(context.Background(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}
