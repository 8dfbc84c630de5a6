package apiserver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

// TestWithListGzip: a list request whose client accepts gzip carries a
// GzipResponse with the headers of the writer the handler has; every other
// request, none.
func TestWithListGzip(t *testing.T) {
	for _, tc := range []struct {
		name, verb string
		header     http.Header
		resource   bool
		carries    bool
	}{
		{name: "a list accepting gzip", verb: "list", resource: true, header: http.Header{"Accept-Encoding": {"deflate, gzip"}}, carries: true},
		{name: "a list accepting no gzip", verb: "list", resource: true, header: http.Header{"Accept-Encoding": {"deflate"}}},
		{name: "a get", verb: "get", resource: true, header: http.Header{"Accept-Encoding": {"gzip"}}},
		{name: "a watch", verb: "watch", resource: true, header: http.Header{"Accept-Encoding": {"gzip"}}},
		{name: "not a resource", verb: "list", header: http.Header{"Accept-Encoding": {"gzip"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/apis/g/v1/things", nil)
			req.Header = tc.header.Clone()
			req = req.WithContext(request.WithRequestInfo(req.Context(), &request.RequestInfo{IsResourceRequest: tc.resource, Verb: tc.verb}))
			var got *registry.GzipResponse
			var handed http.ResponseWriter
			h := WithListGzip(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got, handed = registry.GzipResponseFrom(r.Context()), w
			}), func(w io.Writer) registry.GzipItemStream { return cacher.NewGzipStream(w) })
			h.ServeHTTP(httptest.NewRecorder(), req)
			if got != nil {
				handed.Header().Set("X-Probe", "handed") // got.Header must be the handler's headers
			}
			if (got != nil) != tc.carries || got != nil && (got.Header.Get("X-Probe") != "handed" || got.NewStream == nil) {
				t.Fatalf("GzipResponse %+v, want one: %v", got, tc.carries)
			}
		})
	}
}
