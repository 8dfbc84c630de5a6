package fuzz

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// answerTimeout bounds a list's or get's answer, and a watch's headers: a
// request that takes longer hangs.
const answerTimeout = 15 * time.Second

// watchRead is how long a watch that was accepted is read.
const watchRead = time.Second

// FuzzReads sends lists, watches and gets with every query parameter the
// read paths take, and any Accept header, accepting gzip as client-go
// does. Every answer must be a success or a 4xx Status, never a 5xx, a
// dropped connection, a broken gzip stream or a hang, and a JSON success
// must be JSON; a watch's ERROR events likewise. The one 5xx allowed is upstream's 504 for a
// resourceVersion the server has not reached.
//
//	go test ./test/fuzz -run '^$' -fuzz '^FuzzReads$' -fuzztime 10m   (make fuzz)
func FuzzReads(f *testing.F) {
	type in struct {
		verb                                                                                uint8
		ns, name, rv, match, limit, cont, label, field, shard, timeout, bm, initial, accept string
	}
	for _, c := range []in{
		{verb: 0, ns: "fuzz-a"},
		{verb: 0, ns: "fuzz-a", rv: "0", limit: "2"},
		{verb: 0, rv: "0", match: "NotOlderThan", limit: "-1"},
		{verb: 0, ns: "fuzz-a", rv: "1", match: "Exact"},
		{verb: 0, ns: "fuzz-a", rv: "99999999999", match: "Exact"},
		{verb: 0, ns: "fuzz-a", rv: "abc"},
		{verb: 0, ns: "fuzz-a", rv: "-1"},
		{verb: 0, ns: "fuzz-a", rv: "18446744073709551616"},
		{verb: 0, ns: "fuzz-a", match: "Exact"},
		{verb: 0, ns: "fuzz-a", match: "bogus", rv: "0"},
		{verb: 0, ns: "fuzz-a", limit: "abc"},
		{verb: 0, ns: "fuzz-a", limit: "9223372036854775807"},
		{verb: 0, ns: "fuzz-a", limit: "1", cont: "garbage"},
		{verb: 0, ns: "fuzz-a", cont: "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiIuLi8ifQ"},
		{verb: 0, ns: "fuzz-a", label: "group=g1"},
		{verb: 0, ns: "fuzz-a", label: "!!=="},
		{verb: 0, ns: "fuzz-a", label: "group in (g0,g1),!missing"},
		{verb: 0, ns: "fuzz-a", field: "spec.agentName=agent-1"},
		{verb: 0, ns: "fuzz-a", field: "metadata.name=a-1"},
		{verb: 0, ns: "fuzz-a", field: "spec.nothing=x"},
		{verb: 0, ns: "fuzz-a", field: "status.phase!=Running,metadata.namespace==fuzz-a"},
		{verb: 0, ns: "fuzz-a", shard: "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"},
		{verb: 0, ns: "fuzz-a", shard: "shardRange(object.metadata.uid, 'nope')"},
		{verb: 0, ns: "fuzz-a", accept: "application/yaml"},
		{verb: 0, ns: "fuzz-a", accept: "application/vnd.kubernetes.protobuf"},
		{verb: 0, ns: "fuzz-a", accept: "text/html"},
		{verb: 0, ns: "fuzz-a", accept: "application/json;as=Table;v=v1;g=meta.k8s.io"},
		{verb: 0, ns: "fuzz-a", accept: "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
		{verb: 0, ns: "fuzz-a", accept: "application/json;as=Table;v=v9;g=meta.k8s.io"},
		{verb: 0, ns: "../fuzz-b"},
		{verb: 0, ns: "%00"},
		{verb: 1, ns: "fuzz-a", bm: "true"},
		{verb: 1, ns: "fuzz-a", rv: "0", timeout: "1"},
		{verb: 1, ns: "fuzz-a", rv: "1"},
		{verb: 1, ns: "fuzz-a", rv: "99999999999"},
		{verb: 1, ns: "fuzz-a", timeout: "-5"},
		{verb: 1, ns: "fuzz-a", timeout: "abc"},
		{verb: 1, ns: "fuzz-a", bm: "maybe"},
		{verb: 1, ns: "fuzz-a", initial: "true", match: "NotOlderThan", bm: "true"},
		{verb: 1, ns: "fuzz-a", initial: "true"},
		{verb: 1, ns: "fuzz-a", initial: "true", match: "Exact", rv: "1", bm: "true"},
		{verb: 1, ns: "fuzz-a", initial: "false", match: "NotOlderThan", rv: "0"},
		{verb: 1, ns: "fuzz-a", field: "metadata.name=a-1"},
		{verb: 1, ns: "fuzz-a", label: "group=g0", shard: "shardRange(object.metadata.namespace, '0x0', '0x10000000000000000')"},
		{verb: 1, ns: "fuzz-a", limit: "1", cont: "x"},
		{verb: 1, ns: "fuzz-a", accept: "application/json;as=Table;v=v1;g=meta.k8s.io"},
		{verb: 1, ns: "fuzz-a", accept: "application/yaml"},
		// Lists large enough to be compressed, in runs shared between lists.
		{verb: 0, ns: manyNamespace},
		{verb: 0, ns: manyNamespace, limit: "150"},
		{verb: 0, ns: manyNamespace, label: "group=g1"},
		{verb: 0, ns: manyNamespace, field: "spec.agentName!=agent-1"},
		{verb: 0, rv: "0"},
		{verb: 0, ns: manyNamespace, accept: "application/json;as=Table;v=v1;g=meta.k8s.io"},
		{verb: 1, ns: manyNamespace, initial: "true", match: "NotOlderThan", bm: "true"},
		{verb: 2, ns: "fuzz-a", name: "a-1"},
		{verb: 2, ns: "fuzz-a", name: "a-1", rv: "0"},
		{verb: 2, ns: "fuzz-a", name: "a-1", rv: "99999999999"},
		{verb: 2, ns: "fuzz-a", name: "missing", rv: "1"},
		{verb: 2, ns: "fuzz-a", name: "..", rv: "0"},
		{verb: 2, ns: "fuzz-a", name: "a-1", accept: "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"},
	} {
		f.Add(c.verb, c.ns, c.name, c.rv, c.match, c.limit, c.cont, c.label, c.field, c.shard, c.timeout, c.bm, c.initial, c.accept)
	}
	s, _ := startServer(f, "")
	f.Fuzz(func(t *testing.T, verb uint8, ns, name, rv, match, limit, cont, label, field, shard, timeout, bm, initial, accept string) {
		q := url.Values{}
		for k, v := range map[string]string{"resourceVersion": rv, "resourceVersionMatch": match, "limit": limit,
			"continue": cont, "labelSelector": label, "fieldSelector": field, "shardSelector": shard,
			"timeoutSeconds": timeout, "allowWatchBookmarks": bm, "sendInitialEvents": initial} {
			if v != "" {
				q.Set(k, v)
			}
		}
		path := "/apis/fleet.example.com/v1beta1/"
		if ns != "" {
			path += "namespaces/" + url.PathEscape(ns) + "/"
		}
		path += "assignments"
		watching := verb%3 == 1
		switch verb % 3 {
		case 1:
			q.Set("watch", "true")
		case 2:
			if name == "" {
				name = "a-0"
			}
			path += "/" + url.PathEscape(name)
		}
		s.check(t, path+"?"+q.Encode(), accept, watching)
	})
}

// check sends a GET and checks its answer as FuzzReads says.
func (s *fuzzServer) check(t *testing.T, target, accept string, watching bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), answerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.host+target, nil)
	if err != nil {
		return // not a request a client could send
	}
	if !httpguts.ValidHeaderFieldValue(accept) {
		return // no client can send it
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("GET %s (Accept %q): no answer within %v", target, accept, answerTimeout)
		}
		t.Fatalf("GET %s (Accept %q): %v", target, accept, err)
	}
	defer resp.Body.Close()
	jsonBody := strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json")
	if resp.StatusCode != http.StatusOK || !watching {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s (Accept %q): reading the %d answer: %v", target, accept, resp.StatusCode, err)
		}
		switch {
		case resp.StatusCode == http.StatusOK && jsonBody && !json.Valid(body):
			t.Fatalf("GET %s (Accept %q): 200 with a body that is no JSON: %.200q", target, accept, body)
		case resp.StatusCode >= 300 && jsonBody:
			checkStatusBody(t, target, accept, resp.StatusCode, body)
		case resp.StatusCode >= 500:
			t.Fatalf("GET %s (Accept %q): %d %.200q", target, accept, resp.StatusCode, body)
		}
		return
	}
	// An accepted watch: read its events for a while.
	stop := time.AfterFunc(watchRead, cancel)
	defer stop.Stop()
	if !jsonBody {
		_, _ = io.Copy(io.Discard, resp.Body)
		return
	}
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	for {
		var ev metav1.WatchEvent
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return
			}
			t.Fatalf("GET %s (Accept %q): reading the watch: %v", target, accept, err)
		}
		if ev.Type == "ERROR" {
			var status metav1.Status
			if err := json.Unmarshal(ev.Object.Raw, &status); err != nil {
				t.Fatalf("GET %s (Accept %q): an ERROR event that is no Status: %.200q", target, accept, ev.Object.Raw)
			}
			checkStatus(t, target, accept, &status)
		}
	}
}

// checkStatusBody requires a failed answer's body to be a Status, and
// checks it as checkStatus does.
func checkStatusBody(t *testing.T, target, accept string, code int, body []byte) {
	t.Helper()
	var status metav1.Status
	if err := json.Unmarshal(body, &status); err != nil || status.Kind != "Status" {
		t.Fatalf("GET %s (Accept %q): %d with a body that is no Status: %.200q", target, accept, code, body)
	}
	checkStatus(t, target, accept, &status)
}

// checkStatus fails on a 5xx Status but upstream's 504 for a
// resourceVersion the server has not reached.
func checkStatus(t *testing.T, target, accept string, status *metav1.Status) {
	t.Helper()
	if status.Code < 500 {
		return
	}
	if status.Code == http.StatusGatewayTimeout && status.Details != nil && slices.ContainsFunc(status.Details.Causes,
		func(c metav1.StatusCause) bool { return c.Type == metav1.CauseTypeResourceVersionTooLarge }) {
		return
	}
	t.Fatalf("GET %s (Accept %q): %d %s: %s", target, accept, status.Code, status.Reason, status.Message)
}

// futureRV is a revision far beyond the data's.
const futureRV = 1 << 40

// FuzzContinue lists one namespace's Assignments with forged continue
// tokens, through our cache and through a server on the same etcd that
// reads etcd directly, as upstream's etcd3 storage does. A token never
// lists an object outside the request's namespace and resource, and both
// servers answer it alike: the same code, the same objects.
//
//	go test ./test/fuzz -run '^$' -fuzz '^FuzzContinue$' -fuzztime 10m   (make fuzz)
func FuzzContinue(f *testing.F) {
	for _, c := range []struct {
		start string
		rv    int64
	}{
		{"a-1\x00", 0},        // the first page's own token, at the current revision
		{"a-1\x00", 2},        // an old revision, maybe compacted
		{"a-1\x00", 1 << 40},  // a future revision
		{"a-1\x00", -1},       // a consistent read
		{"../fuzz-b/a-0", 0},  // another namespace
		{"/../fuzz-b/a-0", 0}, // another namespace, absolute
		{"../../agents/a", 0}, // another resource's prefix
		{"fuzz-a/../../x", 0}, // .. inside
		{"", 0},               // no start
		{"a-0/./a-1", 0},      // not clean
		{"\x00\xff", 0},       // not UTF-8
		{strings.Repeat("a/", 200), 0},
	} {
		f.Add(c.start, c.rv)
	}
	cached, etcd := startServer(f, "")
	direct, _ := startServer(f, etcd, "--watch-cache=false")
	current := revision(f, cached)
	f.Fuzz(func(t *testing.T, start string, rv int64) {
		switch {
		case rv == 0:
			rv = current
		case rv > current+1 && rv != futureRV:
			// Mostly revisions the data has: each future one waits for
			// the cache's freshness timeout, 3 s, before its 504.
			rv %= current + 2
		}
		token, _ := json.Marshal(map[string]any{"v": "meta.k8s.io/v1", "rv": rv, "start": start})
		target := "/apis/fleet.example.com/v1beta1/namespaces/fuzz-a/assignments?limit=2&continue=" +
			url.QueryEscape(base64.RawURLEncoding.EncodeToString(token))
		ours, oursCode := cached.list(t, target)
		theirs, theirsCode := direct.list(t, target)
		for _, a := range ours {
			if a.Namespace != "fuzz-a" || !strings.HasPrefix(a.Name, "a-") {
				t.Fatalf("start %q rv %d: listed %s/%s from the namespace fuzz-a's Assignments", start, rv, a.Namespace, a.Name)
			}
		}
		if oursCode != theirsCode || fmt.Sprint(names(ours)) != fmt.Sprint(names(theirs)) {
			t.Fatalf("start %q rv %d: ours answered %d %v, etcd3 %d %v", start, rv, oursCode, names(ours), theirsCode, names(theirs))
		}
	})
}

// list returns the Assignments a list answers, and its code; it fails the
// test on a 5xx other than a future resourceVersion's 504.
func (s *fuzzServer) list(t *testing.T, target string) ([]v1beta1.Assignment, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), answerTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.host+target, nil)
	resp, err := s.http.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		checkStatusBody(t, target, "", resp.StatusCode, body)
		return nil, resp.StatusCode
	}
	var list v1beta1.AssignmentList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	return list.Items, resp.StatusCode
}

func names(items []v1beta1.Assignment) []string {
	var out []string
	for _, a := range items {
		out = append(out, a.Namespace+"/"+a.Name)
	}
	return out
}

// revision is the server's current resourceVersion, from a list.
func revision(f *testing.F, s *fuzzServer) int64 {
	f.Helper()
	resp, err := s.http.Get(s.host + "/apis/fleet.example.com/v1beta1/namespaces/fuzz-a/assignments")
	if err != nil {
		f.Fatal(err)
	}
	defer resp.Body.Close()
	var list metav1.List
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		f.Fatal(err)
	}
	var rv int64
	if _, err := fmt.Sscan(list.ResourceVersion, &rv); err != nil {
		f.Fatal(err)
	}
	return rv
}
