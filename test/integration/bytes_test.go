package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	fleetfuzzer "github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/fuzzer"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/apiserver"
)

// equalityNamespace holds the objects TestResponsesFromBytes writes, and
// equalityListNamespace the many it lists compressed.
const (
	equalityNamespace     = "bytes"
	equalityListNamespace = "bytes-list"
)

// TestResponsesFromBytes: the cache keeps each object as its bytes and
// writes JSON responses at the storage version from them, and decodes for
// every other. Every response must still be byte for byte what the normal
// encoders write for the decoded object: a server without the cache over
// the same etcd, asked the same, is the reference. The objects are written
// to etcd directly, so that they hold whatever the fuzzer and the edge cases
// put in them, validation or not: lists, gets and watches (every event
// type), both versions, JSON, YAML, pretty JSON, Table and
// PartialObjectMetadata.
func TestResponsesFromBytes(t *testing.T) {
	cached := startServer(t, t.TempDir())
	plain := startServer(t, t.TempDir(), "--etcd-servers", cached.EtcdEndpoint, "--watch-cache=false")
	etcd := cached.etcdClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	codec := apiserver.Codecs.LegacyCodec(v1beta1.SchemeGroupVersion)
	put := func(ns string, a *fleet.Assignment) int64 {
		t.Helper()
		a.Namespace, a.ResourceVersion = ns, ""
		data, err := runtime.Encode(codec, a)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := etcd.Put(ctx, "/registry/fleet.example.com/assignments/"+ns+"/"+a.Name, string(data))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	start, err := etcd.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	from := start.Header.Revision

	objs := append(fuzzedAssignments(20), edgeAssignments()...)
	var rv int64
	for _, a := range objs {
		rv = put(equalityNamespace, a)
	}
	// Modified and deleted, for every event type.
	for _, a := range objs[:5] {
		a.Spec.Payload += " changed"
		a.Labels = map[string]string{"changed": "yes"}
		rv = put(equalityNamespace, a)
	}
	for _, a := range objs[5:8] {
		resp, err := etcd.Delete(ctx, "/registry/fleet.example.com/assignments/"+equalityNamespace+"/"+a.Name)
		if err != nil {
			t.Fatal(err)
		}
		rv = resp.Header.Revision
	}
	writes := len(objs) + 5 + 3
	// A list larger than the library's threshold for gzip, 128 KiB, with
	// enough items for runs to begin at some.
	many := fuzzedAssignments(600)
	for i, a := range many {
		a.Name = fmt.Sprintf("many-%04d", i)
		rv = put(equalityListNamespace, a)
	}

	accepts := []string{
		"application/json",
		"application/yaml",
		"application/json;as=Table;v=v1;g=meta.k8s.io",
		"application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
	}
	// A cache started after the writes holds what its first list read
	// from etcd, whose bytes it writes from the bytes etcd held; the
	// first server's cache holds what its watch read.
	listed := startServer(t, t.TempDir(), "--etcd-servers", cached.EtcdEndpoint)
	// And one that compresses what it listed, at its first pass as it is
	// ready (issue 67): every response is read through the records.
	compressed := startServer(t, t.TempDir(), "--etcd-servers", cached.EtcdEndpoint, "--watch-cache-compression=s2")
	cachedClient, plainClient := httpClient(t, cached.Config), httpClient(t, plain.Config)
	caches := []struct {
		url    string
		client *http.Client
	}{{cached.URL, cachedClient}, {listed.URL, httpClient(t, listed.Config)}, {compressed.URL, httpClient(t, compressed.Config)}}
	for _, version := range []string{"v1beta1", "v1alpha1"} {
		base := "/apis/fleet.example.com/" + version + "/namespaces/" + equalityNamespace + "/assignments"
		for _, c := range caches {
			for _, accept := range accepts {
				// A resourceVersion both servers serve the same state at: the last write's.
				for _, query := range []string{fmt.Sprintf("?resourceVersion=%d&resourceVersionMatch=NotOlderThan", rv),
					fmt.Sprintf("?resourceVersion=%d&resourceVersionMatch=NotOlderThan&pretty=true", rv),
					fmt.Sprintf("?resourceVersion=%d&resourceVersionMatch=NotOlderThan&limit=7", rv)} {
					sameResponse(t, c.client, plainClient, c.url, plain.URL, base+query, accept)
				}
			}
			for _, a := range objs[8:] {
				for _, accept := range []string{"application/json", "application/yaml",
					"application/json;as=Table;v=v1;g=meta.k8s.io", "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"} {
					sameResponse(t, c.client, plainClient, c.url, plain.URL, base+"/"+a.Name, accept)
				}
			}
		}
		for _, accept := range []string{"application/json", "application/json;as=Table;v=v1;g=meta.k8s.io",
			"application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"} {
			path := fmt.Sprintf("%s?watch=1&resourceVersion=%d", base, from)
			got := watchLines(ctx, t, cachedClient, cached.URL+path, accept, writes)
			want := watchLines(ctx, t, plainClient, plain.URL+path, accept, writes)
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Errorf("%s %s, event %d:\n%s", path, accept, i, firstDifference(got[i], want[i]))
					break
				}
			}
		}
		// A list whose client accepts gzip: ours sends runs of objects the
		// cache compressed once (pkg/apiserver's WithListGzip), as segments
		// of one gzip member, and must send what the server without the
		// cache sends a client that accepts no encoding. Twice, so that the
		// second is sent the runs the first compressed.
		list := fmt.Sprintf("/apis/fleet.example.com/%s/namespaces/%s/assignments?resourceVersion=%d&resourceVersionMatch=NotOlderThan",
			version, equalityListNamespace, rv)
		wantList, _ := encodedBody(ctx, t, plainClient, plain.URL+list, "identity")
		for _, c := range caches {
			for i := range 2 {
				runs, requests := gzipRuns(t), requestsOf(t, "LIST", version)
				got, members := encodedBody(ctx, t, c.client, c.url+list, "gzip")
				if !bytes.Equal(got, wantList) || members != 1 {
					t.Errorf("%s gzip, in %d members:\n%s", list, members, firstDifference(got, wantList))
				}
				// The list is the library's request as any other: counted
				// with its status and the bytes it sent.
				if d := requestsOf(t, "LIST", version).minus(requests); d.ok != 1 || d.all != 1 || d.bytes < 1000 {
					t.Errorf("%s gzip, list %d: the request metrics counted %+v", list, i, d)
				}
				// The first list compresses its runs, the second sends them;
				// a list at another version is the library's, which has none.
				runs = gzipRuns(t).minus(runs)
				if want := version == "v1beta1"; (runs.compressed > 0) != (want && i == 0) || (runs.shared > 0) != (want && i == 1) {
					t.Errorf("%s gzip, list %d: %+v runs", list, i, runs)
				}
			}
		}
		// A watch-list whose client accepts gzip: ours sends runs of events
		// the cache compressed once (pkg/apiserver's WithWatchListGzip),
		// and must send what it sends a client that accepts no encoding.
		// (Not compared with the server without the cache, whose etcd
		// watch sends the initial-events-end bookmark only after etcd's
		// next progress notification.) Twice, so that the second is sent
		// the runs the first compressed.
		path := fmt.Sprintf("%s?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion=%d&timeoutSeconds=1", base, rv)
		live := len(objs) - 3
		want := encodedWatchLines(ctx, t, cachedClient, cached.URL+path, "identity", live+1)
		for range 2 {
			requests := requestsOf(t, "WATCH", version)
			got := encodedWatchLines(ctx, t, cachedClient, cached.URL+path, "gzip", live+1)
			// Counted once. Not with its code and bytes: ours serves watches
			// with the generic server's APIServingWithRoutine (issue 57),
			// which records a watch when its handler chain returns, before
			// the watch is served, as kube-apiserver does with that gate on.
			if d := requestsOf(t, "WATCH", version).minus(requests); d.all != 1 {
				t.Errorf("%s gzip: the request metrics counted %+v", path, d)
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Errorf("%s gzip, event %d:\n%s", path, i, firstDifference(got[i], want[i]))
					break
				}
			}
		}
	}
}

// runCounts are the counts of cached_apiserver_watch_cache_gzip_runs_total.
type runCounts struct{ compressed, shared float64 }

func gzipRuns(t testing.TB) runCounts {
	t.Helper()
	const name = "cached_apiserver_watch_cache_gzip_runs_total"
	return runCounts{compressed: metricValue(t, legacyregistry.DefaultGatherer, name, map[string]string{"result": "compressed"}),
		shared: metricValue(t, legacyregistry.DefaultGatherer, name, map[string]string{"result": "shared"})}
}

func (r runCounts) minus(o runCounts) runCounts {
	return runCounts{compressed: r.compressed - o.compressed, shared: r.shared - o.shared}
}

// requestCounts are what the library's request metrics counted of
// requests of one verb for assignments: those answered 200, every one, and
// the bytes sent.
type requestCounts struct{ ok, all, bytes float64 }

func requestsOf(t testing.TB, verb, version string) requestCounts {
	t.Helper()
	g := legacyregistry.DefaultGatherer
	labels := func(more ...string) map[string]string {
		m := map[string]string{"verb": verb, "group": "fleet.example.com", "version": version, "resource": "assignments"}
		for i := 0; i < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	return requestCounts{ok: metricValue(t, g, "apiserver_request_total", labels("code", "200")),
		all:   metricValue(t, g, "apiserver_request_total", labels()),
		bytes: metricValue(t, g, "apiserver_response_sizes", labels())}
}

func (r requestCounts) minus(o requestCounts) requestCounts {
	return requestCounts{ok: r.ok - o.ok, all: r.all - o.all, bytes: r.bytes - o.bytes}
}

// encodedWatchLines reads the first n events of a JSON watch that ends
// by itself, asked for with Accept-Encoding encoding, gzip or identity, in
// which it must come.
func encodedWatchLines(ctx context.Context, t testing.TB, c *http.Client, url, encoding string, n int) [][]byte {
	t.Helper()
	body, _ := encodedBody(ctx, t, c, url, encoding)
	lines := bytes.SplitAfter(body, []byte("\n"))
	if len(lines) < n {
		t.Fatalf("watch %s: %d events, want %d", url, len(lines), n)
	}
	return lines[:n]
}

// encodedBody reads a JSON response that ends by itself, asked for with
// Accept-Encoding encoding, gzip or identity, in which it must come, and
// returns it decoded, and how many gzip members it came in.
func encodedBody(ctx context.Context, t testing.TB, c *http.Client, url, encoding string) ([]byte, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	// Set, so that the transport hands the body on as it came.
	req.Header.Set("Accept-Encoding", encoding)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if got := cmp.Or(resp.Header.Get("Content-Encoding"), "identity"); resp.StatusCode != http.StatusOK || got != encoding {
		t.Fatalf("GET %s: %d in %s, want 200 in %s: %.300q", url, resp.StatusCode, got, encoding, body)
	}
	if encoding != "gzip" {
		return body, 0
	}
	members := testkit.GzipMembers(t, body)
	return bytes.Join(members, nil), len(members)
}

// fuzzedAssignments returns n Assignments filled by the group's fuzzer,
// with names of their own.
func fuzzedAssignments(n int) []*fleet.Assignment {
	seed := time.Now().UnixNano()
	f := fuzzer.FuzzerFor(fuzzer.MergeFuzzerFuncs(metafuzzer.Funcs, fleetfuzzer.Funcs), rand.NewSource(seed), apiserver.Codecs)
	out := make([]*fleet.Assignment, n)
	for i := range out {
		a := &fleet.Assignment{}
		f.Fill(a)
		a.Name = fmt.Sprintf("fuzzed-%02d", i)
		out[i] = a
	}
	return out
}

// edgeAssignments are objects whose JSON an encoder may write differently
// from a naive copy: characters escaped for HTML, U+2028, non-ASCII, empty
// maps and nil slices, managedFields, a deletionTimestamp.
func edgeAssignments() []*fleet.Assignment {
	now := metav1.Unix(1_800_000_000, 0)
	return []*fleet.Assignment{
		{ObjectMeta: metav1.ObjectMeta{Name: "html", Annotations: map[string]string{"note": `<b>"a" & 'b'</b>`}},
			Spec: fleet.AssignmentSpec{AgentName: "agent<1>", Payload: "a\u2028b\u2029c"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "unicode", Labels: map[string]string{"lang": "ja"}},
			Spec: fleet.AssignmentSpec{AgentName: "agent-é", Payload: "日本語 ünïcödé \x01 \t"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "empty", Labels: map[string]string{}, Annotations: map[string]string{}, Finalizers: nil}},
		{ObjectMeta: metav1.ObjectMeta{Name: "managed", CreationTimestamp: now, ManagedFields: []metav1.ManagedFieldsEntry{{
			Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "fleet.example.com/v1beta1",
			Time: &now, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:payload":{}}}`)}}}},
			Spec: fleet.AssignmentSpec{AgentName: "agent-m"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "deleting", DeletionTimestamp: &now, Finalizers: []string{"fleet.example.com/keep"},
			DeletionGracePeriodSeconds: new(int64)}, Spec: fleet.AssignmentSpec{AgentName: "agent-d"}},
	}
}

// httpClient is a client for cfg's server that speaks HTTP itself.
func httpClient(t testing.TB, cfg *rest.Config) *http.Client {
	t.Helper()
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sameResponse asks both servers for path in accept and fails the test
// unless they answer the same status and bytes.
func sameResponse(t testing.TB, cachedClient, plainClient *http.Client, cachedURL, plainURL, path, accept string) {
	t.Helper()
	gotCode, got := fetch(t, cachedClient, cachedURL+path, accept)
	wantCode, want := fetch(t, plainClient, plainURL+path, accept)
	if gotCode != wantCode || !bytes.Equal(got, want) {
		t.Errorf("%s %s: %d, want %d:\n%s", path, accept, gotCode, wantCode, firstDifference(got, want))
	}
}

func fetch(t testing.TB, c *http.Client, url, accept string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := open(ctx, t, c, url, accept)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// open sends a GET for url asking for accept, and returns the response.
func open(ctx context.Context, t testing.TB, c *http.Client, url, accept string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", accept)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// watchLines reads n events of a JSON watch, one a line.
func watchLines(ctx context.Context, t testing.TB, c *http.Client, url, accept string, n int) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp := open(ctx, t, c, url, accept)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("watch %s: %d %s", url, resp.StatusCode, body)
	}
	r := bufio.NewReaderSize(resp.Body, 1<<20)
	out := make([][]byte, 0, n)
	for len(out) < n {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("watch %s: %d of %d events, then %v", url, len(out), n, err)
		}
		out = append(out, line)
	}
	return out
}

// firstDifference shows where got and want part.
func firstDifference(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-80)
	clip := func(b []byte) string { return strings.ToValidUTF8(string(b[from:min(len(b), i+80)]), "?") }
	return fmt.Sprintf("at byte %d of %d (want %d):\n got: %q\nwant: %q", i, len(got), len(want), clip(got), clip(want))
}
