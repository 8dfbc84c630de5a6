// Command cpuowners attributes a CPU profile's samples to who pays them:
// the creates (any frame of the generic create handler, or of the
// goroutine the timeout filter runs a short request in, which during
// bench-serve's writes are its creates), else the innermost
// frame of a known owner: x/net/http2 and TLS, the cache (ours or
// upstream's cacher, and etcd3's watch), the generic server and watch
// handler, the etcd client; else the garbage collector or the Go
// scheduler. It is how docs/benchmarks.md splits bench-serve's profiles of
// the writes.
//
//	cd hack/cpuowners && go run . profile.pprof...
package main

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/pprof/profile"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cpuowners profile.pprof...")
		os.Exit(2)
	}
	for _, path := range os.Args[1:] {
		if err := report(path); err != nil {
			fmt.Fprintln(os.Stderr, "cpuowners:", err)
			os.Exit(1)
		}
	}
}

func report(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	cpu := len(p.SampleType) - 1 // the CPU time, after the sample count
	by := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		total += s.Value[cpu]
		by[owner(frames(s))] += s.Value[cpu]
	}
	owners := make([]string, 0, len(by))
	for o := range by {
		owners = append(owners, o)
	}
	slices.SortFunc(owners, func(a, b string) int { return cmp.Compare(by[b], by[a]) })
	fmt.Printf("%s: %.2f s sampled\n", path, float64(total)/1e9)
	for _, o := range owners {
		fmt.Printf("%5.1f%%  %s\n", 100*float64(by[o])/float64(total), o)
	}
	return nil
}

// frames returns a sample's function names, innermost first.
func frames(s *profile.Sample) []string {
	var out []string
	for _, l := range s.Location {
		for _, ln := range l.Line {
			if ln.Function != nil {
				out = append(out, ln.Function.Name)
			}
		}
	}
	return out
}

// owners are matched against a sample's frames from the innermost out.
var owners = []struct{ name, prefix string }{
	{"x/net and TLS", "golang.org/x/net/http2."},
	{"x/net and TLS", "crypto/tls."},
	{"x/net and TLS", "net/http."},
	{"x/net and TLS", "bufio."},
	{"cache", "github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"},
	{"cache", "k8s.io/apiserver/pkg/storage/cacher"},
	{"cache", "k8s.io/apiserver/pkg/storage/etcd3"},
	{"generic server and watch handler", "k8s.io/apiserver/pkg/endpoints/"},
	{"generic server and watch handler", "k8s.io/apiserver/pkg/server"},
	{"generic server and watch handler", "go.opentelemetry.io/"},
	{"generic server and watch handler", "github.com/felixge/httpsnoop"},
	{"etcd client", "google.golang.org/grpc"},
	{"etcd client", "go.etcd.io/"},
}

// owner names who pays for a sample whose frames, innermost first, are fs.
func owner(fs []string) string {
	for _, f := range fs {
		if strings.Contains(f, "handlers.CreateResource") || strings.Contains(f, "(*timeoutHandler).ServeHTTP.func1") {
			return "creates"
		}
	}
	for _, f := range fs {
		for _, o := range owners {
			if strings.HasPrefix(f, o.prefix) {
				return o.name
			}
		}
	}
	for _, f := range fs {
		if strings.HasPrefix(f, "runtime.gcBgMarkWorker") || strings.HasPrefix(f, "runtime.bgsweep") || strings.HasPrefix(f, "runtime.bgscavenge") {
			return "garbage collector"
		}
	}
	if len(fs) > 0 && strings.HasPrefix(fs[len(fs)-1], "runtime.") {
		return "Go scheduler and runtime"
	}
	return "other"
}
