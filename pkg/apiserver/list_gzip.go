package apiserver

import (
	"io"
	"net/http"

	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/features"

	"github.com/cached-apiserver/cached-apiserver/pkg/registry"
)

// WithListGzip wraps handler, which must run after the request-info
// filter, so that a list request whose client accepts gzip carries a
// registry.GzipResponse: a list the watch cache shares then writes its
// response compressed with newStream, which compresses runs of the cache's
// objects once for every list instead of once for each. Any other list,
// and every other request, is written by the library as before.
func WithListGzip(handler http.Handler, newStream func(io.Writer) registry.GzipItemStream) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if responsewriters.ContentEncodingSupported(req, features.APIResponseCompression) != "gzip" || !isList(req) {
			handler.ServeHTTP(w, req)
			return
		}
		ctx := registry.WithGzipResponse(req.Context(), &registry.GzipResponse{Header: w.Header(), NewStream: newStream})
		handler.ServeHTTP(w, req.WithContext(ctx))
	})
}

func isList(req *http.Request) bool {
	info, ok := request.RequestInfoFrom(req.Context())
	return ok && info.IsResourceRequest && info.Verb == "list"
}
