package faults

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// The servers a scenario runs against.
const (
	// ours is cmd/cached-apiserver as shipped.
	ours = "ours"
	// upstream is the same server over upstream's Cacher (test/bench/cmd/server-upstream).
	upstream = "upstream"
)

// consistencyCheckInterval makes our cache check itself against etcd
// several times a scenario; a failed check is a finding.
const consistencyCheckInterval = "5s"

// apiServer is cached-apiserver, ours or upstream-wired, as a process in
// standalone mode over external etcd.
type apiServer struct {
	impl string
	proc *testkit.Process
	// config reaches the server as its admin, from the kubeconfig it writes.
	config *rest.Config
	raw    *rest.RESTClient
	// mu guards starts, and what they record, and listTimeout.
	mu sync.Mutex
	// starts records each start of the server: its readiness.
	starts []*start
	// listTimeout is how long a start's list may take before it counts as
	// failed; 0 is 2 s. Under load the first lists after a restart wait
	// for CPU, not for the cache.
	listTimeout time.Duration
}

// startServer runs bin over etcdServers and waits until it is ready. env
// goes to the process, as the fault-injection build's fault. With pki, the
// server uses a copy of that directory's certificates instead of its own.
// extra are flags after the harness's own, which they override.
func startServer(tb testing.TB, impl, bin, dir string, etcdServers []string, env []string, pki string, extra ...string) *apiServer {
	tb.Helper()
	if pki != "" {
		if err := os.CopyFS(filepath.Join(dir, "pki"), os.DirFS(pki)); err != nil {
			tb.Fatal(err)
		}
	}
	port := testkit.FreePort(tb)
	args := []string{
		"--data-dir", dir,
		"--secure-port", strconv.Itoa(port),
		"--etcd-servers", strings.Join(etcdServers, ","),
		"--watch-cache-consistency-check-interval", consistencyCheckInterval,
		// The harness's own clients must not meet the in-flight limits.
		"--max-requests-inflight", "0", "--max-mutating-requests-inflight", "0",
	}
	args = append(args, extra...)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	s := &apiServer{impl: impl}
	s.proc = testkit.StartProcess(tb, testkit.ProcessConfig{Name: impl + "-" + filepath.Base(dir), LogPath: filepath.Join(dir, "server.log"),
		Bin: bin, Env: env, Args: args})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.waitReady(ctx, filepath.Join(dir, "kubeconfig")); err != nil {
		tb.Fatalf("%s never became ready: %v (log: %s)", impl, err, s.proc.LogPath())
	}
	return s
}

// readinessPoll is how often a starting server's /readyz and lists are
// tried while it starts.
const readinessPoll = 20 * time.Millisecond

// start is what one start of the server showed: when /readyz first said
// ready, and when each resource first listed.
type start struct {
	at     time.Time
	readyz time.Time
	// listed is when each resource first listed, by resource.
	listed map[string]time.Time
	// refused is when a list sent after /readyz's first 200 failed, by
	// resource: the server said ready while that cache did not serve.
	refused map[string]time.Time
}

// waitReady waits until /readyz answers 200, and records when it did and
// when each resource first listed: /readyz must not say ready before
// every resource's cache serves (checkReadiness). Each resource not yet
// listed is listed once right after that 200; a list sent after it that
// fails is the violation. Comparing the times of a list tried before the
// 200 with the 200 itself would flag a cache that became ready between the
// two requests. Lists that still fail then are tried on, for up to a
// minute, in the background.
func (s *apiServer) waitReady(ctx context.Context, kubeconfig string) error {
	st := &start{at: time.Now(), listed: map[string]time.Time{}, refused: map[string]time.Time{}}
	s.mu.Lock()
	s.starts = append(s.starts, st)
	s.mu.Unlock()
	err := wait.PollUntilContextCancel(ctx, readinessPoll, true, func(ctx context.Context) (bool, error) {
		if !s.proc.Running() {
			return false, fmt.Errorf("%s exited", s.impl)
		}
		if s.config == nil {
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return false, nil
			}
			cfg.QPS, cfg.Burst = -1, -1
			raw := rest.CopyConfig(cfg)
			raw.GroupVersion = nil
			raw.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
			rc, err := rest.UnversionedRESTClientFor(raw)
			if err != nil {
				return false, err
			}
			s.config, s.raw = cfg, rc
		}
		s.tryLists(ctx, st)
		if s.readyz(ctx) != http.StatusOK {
			return false, nil
		}
		s.mu.Lock()
		st.readyz = time.Now()
		s.mu.Unlock()
		s.tryLists(ctx, st)
		s.mu.Lock()
		for _, res := range listed {
			if _, ok := st.listed[res]; !ok {
				st.refused[res] = time.Now()
			}
		}
		s.mu.Unlock()
		return true, nil
	})
	if err == nil {
		go func() {
			lctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = wait.PollUntilContextCancel(lctx, readinessPoll, true, func(ctx context.Context) (bool, error) {
				return s.tryLists(ctx, st), nil
			})
		}()
	}
	return err
}

// listed are the resources a start's lists read.
var listed = []string{"assignments", "agents"}

// tryLists lists each resource that has not listed yet in st, once,
// consistently and without retries, and reports whether all have.
func (s *apiServer) tryLists(ctx context.Context, st *start) bool {
	done := true
	for _, res := range listed {
		s.mu.Lock()
		_, ok := st.listed[res]
		s.mu.Unlock()
		if ok {
			continue
		}
		s.mu.Lock()
		timeout := cmp.Or(s.listTimeout, 2*time.Second)
		s.mu.Unlock()
		lctx, cancel := context.WithTimeout(ctx, timeout)
		var code int
		s.raw.Get().AbsPath("/apis/fleet.example.com/v1beta1", res).Param("limit", "1").MaxRetries(0).Do(lctx).StatusCode(&code)
		cancel()
		if code != http.StatusOK {
			done = false
			continue
		}
		s.mu.Lock()
		st.listed[res] = time.Now()
		s.mu.Unlock()
	}
	return done
}

// checkReadiness counts each start of the server whose /readyz said ready
// while a resource's list still failed: a rolling update then takes the
// next old pod down while the new one refuses reads (issue 56).
func (s *apiServer) checkReadiness() watchcheck.Violations {
	var v watchcheck.Violations
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, st := range s.starts {
		if st.readyz.IsZero() {
			continue
		}
		for _, res := range listed {
			switch at, ok := st.listed[res]; {
			case !ok:
				v.Note(&v.Readiness, "%s, start %d: /readyz said ready at %+.2fs; %s never listed", s.proc.Name(), i,
					st.readyz.Sub(st.at).Seconds(), res)
			case !st.refused[res].IsZero():
				v.Note(&v.Readiness, "%s, start %d: /readyz said ready at %+.2fs, a list of %s after it failed at %+.2fs, %s listed only at %+.2fs", s.proc.Name(), i,
					st.readyz.Sub(st.at).Seconds(), res, st.refused[res].Sub(st.at).Seconds(), res, at.Sub(st.at).Seconds())
			}
		}
	}
	return v
}

// readyz returns /readyz's status code, or 0 if it did not answer.
func (s *apiServer) readyz(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var code int
	s.raw.Get().AbsPath("/readyz").Do(ctx).StatusCode(&code)
	return code
}

// restart stops the server with SIGTERM, as a rolling update does, and
// starts it again on the same port and data.
func (s *apiServer) restart(ctx context.Context) error {
	if err := s.proc.Terminate(time.Minute); err != nil {
		return err
	}
	if err := s.proc.Start(); err != nil {
		return err
	}
	return s.waitReady(ctx, "")
}

// metric sums the samples of a metric whose labels include every one of
// labels, from /metrics. A metric the server does not serve is an error,
// not 0: an assertion on it could never fail.
func (s *apiServer) metric(ctx context.Context, name string, labels ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := s.raw.Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		found = true
		match := true
		for _, l := range labels {
			match = match && strings.Contains(line, l)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%s serves no metric %s", s.proc.Name(), name)
	}
	return sum, nil
}
