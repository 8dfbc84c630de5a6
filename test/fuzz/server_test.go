package fuzz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/cmd/server"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// fuzzServer is an in-process server over embedded etcd on 127.0.0.1,
// holding a few Assignments in two namespaces, many in a third, and a few
// Agents.
type fuzzServer struct {
	host string
	http *http.Client
}

// namespaces hold fuzzObjects Assignments each.
var namespaces = []string{"fuzz-a", "fuzz-b"}

const fuzzObjects = 5

// manyNamespace holds manyObjects Assignments of about 1 KiB: lists of it
// are larger than the 128 KiB above which a gzip list is compressed, and
// hold enough objects for runs of them to be compressed once for every
// list (registry.GzipResponse), so that hostile lists take that path too.
const (
	manyNamespace = "fuzz-many"
	manyObjects   = 300
)

// startServer starts a server; with etcd set, one that shares that etcd
// and has flags added, else one with its own embedded etcd and the objects.
func startServer(f *testing.F, etcd string, flags ...string) (*fuzzServer, string) {
	f.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	opts := server.NewOptions(io.Discard)
	fs := pflag.NewFlagSet("fuzz", pflag.ContinueOnError)
	opts.AddFlags(fs)
	args := []string{"--data-dir", f.TempDir(), "--embedded-etcd-log-level", "fatal",
		"--secure-port", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)}
	if etcd != "" {
		args = append(args, "--etcd-servers", etcd)
	}
	if err := fs.Parse(append(args, flags...)); err != nil {
		f.Fatal(err)
	}
	opts.Recommended.SecureServing.Listener = ln
	inst, err := opts.NewInstance()
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inst.Run(ctx) }()
	f.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				f.Errorf("server exited with %v", err)
			}
		case <-time.After(time.Minute):
			f.Error("server did not stop within a minute")
		}
	})

	cfg, err := clientcmd.BuildConfigFromFlags("", inst.Kubeconfig)
	if err != nil {
		f.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, -1
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		f.Fatal(err)
	}
	s := &fuzzServer{host: cfg.Host, http: hc}
	ready := func(ctx context.Context) (bool, error) {
		resp, err := hc.Get(cfg.Host + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, ready); err != nil {
		f.Fatal("the server never became ready")
	}

	if etcd != "" {
		return s, etcd
	}
	client := versioned.NewForConfigOrDie(cfg)
	for _, ns := range namespaces {
		for i := range fuzzObjects {
			_, err := client.FleetV1beta1().Assignments(ns).Create(context.Background(), &v1beta1.Assignment{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("a-%d", i), Labels: map[string]string{"group": fmt.Sprintf("g%d", i%2)}},
				Spec:       v1beta1.AssignmentSpec{AgentName: fmt.Sprintf("agent-%d", i%3)},
			}, metav1.CreateOptions{})
			if err != nil {
				f.Fatal(err)
			}
		}
	}
	payload := strings.Repeat("payload ", 80)
	for i := range manyObjects {
		_, err := client.FleetV1beta1().Assignments(manyNamespace).Create(context.Background(), &v1beta1.Assignment{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("a-%d", i), Labels: map[string]string{"group": fmt.Sprintf("g%d", i%2)}},
			Spec:       v1beta1.AssignmentSpec{AgentName: fmt.Sprintf("agent-%d", i%3), Payload: fmt.Sprintf("%d %s", i, payload)},
		}, metav1.CreateOptions{})
		if err != nil {
			f.Fatal(err)
		}
	}
	for i := range 2 {
		if _, err := client.FleetV1beta1().Agents().Create(context.Background(), &v1beta1.Agent{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("agent-%d", i)}}, metav1.CreateOptions{}); err != nil {
			f.Fatal(err)
		}
	}
	return s, inst.EtcdEndpoints[0]
}
