package apiserver

import (
	"io"
	"net/http"

	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/endpoints/responsewriter"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

// GzipStream writes a watch's response as one gzip member whose deflate
// segments end at each flush, so that a client reads everything written
// before it (cacher.GzipStream).
type GzipStream interface {
	io.Writer
	Flush() error
	Close() error
}

// WithWatchListGzip wraps handler, which must run after the request-info
// filter, so that a watch-list's gzip-compressed response is written by
// newStream, which compresses the events the cache holds once for every
// watch-list instead of once each. k8s.io/apiserver compresses a
// watch-list's response when the client accepts gzip, in a member that it
// ends at every flush (handlers/watch.go, perFlushGzipWriter); this filter
// writes one member whose segments end at the same flushes, with the
// library told the client accepts no encoding, so that it writes the
// events plain and the stream sees each one as the cache wrote it. Every
// other request, and a watch-list whose client does not accept gzip,
// passes untouched.
func WithWatchListGzip(handler http.Handler, newStream func(io.Writer) GzipStream) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// The header checks first: they spare a watch whose client takes
		// no gzip the decode of its options.
		if responsewriters.ContentEncodingSupported(req, features.WatchListCompression) != "gzip" ||
			wsstream.IsWebSocketRequest(req) || !isWatchList(req) {
			handler.ServeHTTP(w, req)
			return
		}
		req = req.Clone(req.Context())
		req.Header.Del("Accept-Encoding")
		gw := &gzipWatchWriter{ResponseWriter: w, newStream: newStream}
		serveThen(handler, responsewriter.WrapForHTTP1Or2(gw), req, gw.close)
	})
}

// isWatchList tells the requests that k8s.io/apiserver compresses a
// watch's response for (handlers/get.go, isListWatchRequest).
func isWatchList(req *http.Request) bool {
	info, ok := request.RequestInfoFrom(req.Context())
	if !ok || !info.IsResourceRequest || info.Verb != "watch" {
		return false
	}
	var opts metainternalversion.ListOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(req.URL.Query(), metav1.SchemeGroupVersion, &opts); err != nil {
		return false // the library answers the error
	}
	return opts.SendInitialEvents != nil && *opts.SendInitialEvents && opts.AllowWatchBookmarks
}

// gzipWatchWriter writes a watch's response through a GzipStream once the
// status is 200 OK, and plain before or otherwise.
type gzipWatchWriter struct {
	http.ResponseWriter
	newStream func(io.Writer) GzipStream

	// Only the watch's handler goroutine uses a gzipWatchWriter.

	wroteHeader bool
	// stream is the body's, if it is compressed.
	stream GzipStream
	// err is the first error of a flush, which has no result to return it
	// in, returned by the next Write.
	err error
}

func (w *gzipWatchWriter) WriteHeader(code int) {
	if w.wroteHeader {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.wroteHeader = true
	// The stream, as the library's; an error before it, plain.
	if code == http.StatusOK {
		w.stream = w.newStream(w.ResponseWriter)
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *gzipWatchWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.stream == nil {
		return w.ResponseWriter.Write(p)
	}
	if w.err != nil {
		return 0, w.err
	}
	return w.stream.Write(p)
}

// Flush ends the open segment in a sync flush, where the library's writer
// ends a member, so that the client can read every event written so far.
func (w *gzipWatchWriter) Flush() {
	if w.stream != nil {
		if err := w.stream.Flush(); err != nil && w.err == nil {
			w.err = err
		}
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// close ends the stream's member.
func (w *gzipWatchWriter) close() {
	if w.stream != nil && w.err == nil {
		_ = w.stream.Close() // the response is over: no one to tell
	}
}

// Unwrap implements responsewriter.UserProvidedDecorator.
func (w *gzipWatchWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
