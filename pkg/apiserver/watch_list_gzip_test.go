package apiserver

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

func newStream(w io.Writer) GzipStream { return cacher.NewGzipStream(w) }

// TestGzipWatchWriter: a watch-list's body is a gzip stream of one member
// whose client reads, at every flush, everything written before it, as
// the library's (which ends a member at every flush); an error before the
// stream is written plain. (What the stream shares between watch-lists,
// TestGzipStream in the cache's object package shows.)
func TestGzipWatchWriter(t *testing.T) {
	const flush = "flush"
	for _, tc := range []struct {
		name   string
		status int
		// writes are bytes, or flushes.
		writes []any
		plain  bool
	}{{
		name:   "flushed",
		status: http.StatusOK,
		writes: []any{[]byte("x"), []byte("y"), flush, []byte("z"), flush},
	}, {
		name:   "not flushed at the end",
		status: http.StatusOK,
		writes: []any{[]byte("x"), flush, []byte("w")},
	}, {
		name:   "an error",
		status: http.StatusGone,
		writes: []any{[]byte("gone"), flush},
		plain:  true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			var want []byte
			// flushed are the lengths of the body and of want at each flush.
			var flushed [][2]int
			func() {
				w := &gzipWatchWriter{ResponseWriter: rec, newStream: newStream}
				defer w.close()
				w.WriteHeader(tc.status)
				for _, x := range tc.writes {
					switch x := x.(type) {
					case string:
						w.Flush()
						flushed = append(flushed, [2]int{rec.Body.Len(), len(want)})
					case []byte:
						want = append(want, x...)
						if n, err := w.Write(x); n != len(x) || err != nil {
							t.Fatalf("Write: %d, %v", n, err)
						}
					}
				}
			}()
			body := rec.Body.Bytes()
			if tc.plain {
				if ce := rec.Header().Get("Content-Encoding"); ce != "" || !bytes.Equal(body, want) {
					t.Fatalf("Content-Encoding %q, body %q; want plain %q", ce, body, want)
				}
				return
			}
			if ce := rec.Header().Get("Content-Encoding"); ce != "gzip" {
				t.Fatalf("Content-Encoding %q, want gzip", ce)
			}
			if got := testkit.GzipMembers(t, body); len(got) != 1 || !bytes.Equal(got[0], want) {
				t.Fatalf("members %q, want one of %q", got, want)
			}
			for _, f := range flushed {
				if got := testkit.GzipReadable(body[:f[0]]); !bytes.Equal(got, want[:f[1]]) {
					t.Fatalf("after a flush a client reads %q, want %q", got, want[:f[1]])
				}
			}
		})
	}
}

// TestWithWatchListGzip: the filter takes over only a watch-list whose
// client accepts gzip, and tells the library the client accepts no
// encoding; any other request reaches the library as it came.
func TestWithWatchListGzip(t *testing.T) {
	const watchList = "/apis/g/v1/things?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	for _, tc := range []struct {
		name, url, verb string
		header          http.Header
		takeOver        bool
	}{
		{name: "a watch-list accepting gzip", url: watchList, verb: "watch",
			header: http.Header{"Accept-Encoding": {"deflate, gzip"}}, takeOver: true},
		{name: "a watch-list accepting no gzip", url: watchList, verb: "watch",
			header: http.Header{"Accept-Encoding": {"deflate"}}},
		{name: "a watch-list without bookmarks", url: "/apis/g/v1/things?watch=1&sendInitialEvents=true", verb: "watch",
			header: http.Header{"Accept-Encoding": {"gzip"}}},
		{name: "a watch", url: "/apis/g/v1/things?watch=1", verb: "watch",
			header: http.Header{"Accept-Encoding": {"gzip"}}},
		{name: "a list", url: "/apis/g/v1/things", verb: "list",
			header: http.Header{"Accept-Encoding": {"gzip"}}},
		{name: "a websocket watch-list", url: watchList, verb: "watch",
			header: http.Header{"Accept-Encoding": {"gzip"}, "Connection": {"Upgrade"}, "Upgrade": {"websocket"}}},
		{name: "a watch-list whose options do not parse", url: watchList + "&timeoutSeconds=x", verb: "watch",
			header: http.Header{"Accept-Encoding": {"gzip"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tc.url, nil)
			req.Header = tc.header.Clone()
			req = req.WithContext(request.WithRequestInfo(req.Context(), &request.RequestInfo{IsResourceRequest: true, Verb: tc.verb}))
			var sawEncoding string
			var sawOurs bool
			h := WithWatchListGzip(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sawEncoding = r.Header.Get("Accept-Encoding")
				_, sawOurs = w.(interface{ Unwrap() http.ResponseWriter })
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write([]byte("event\n"))
			}), newStream)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if tc.takeOver {
				if sawEncoding != "" || !sawOurs || rec.Header().Get("Content-Encoding") != "gzip" {
					t.Fatalf("the library saw Accept-Encoding %q, our writer %v, and the response's encoding is %q; want none, ours, gzip",
						sawEncoding, sawOurs, rec.Header().Get("Content-Encoding"))
				}
				if got := testkit.GzipMembers(t, rec.Body.Bytes()); len(got) != 1 || string(got[0]) != "event\n" {
					t.Fatalf("members %q", got)
				}
				return
			}
			if sawEncoding != tc.header.Get("Accept-Encoding") || sawOurs || rec.Body.String() != "event\n" {
				t.Fatalf("the library saw Accept-Encoding %q (want %q), our writer %v, body %q",
					sawEncoding, tc.header.Get("Accept-Encoding"), sawOurs, rec.Body.String())
			}
		})
	}
}
