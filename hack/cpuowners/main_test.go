package main

import "testing"

func TestOwner(t *testing.T) {
	for _, tc := range []struct {
		frames []string // innermost first
		want   string
	}{
		{[]string{"internal/runtime/syscall/linux.Syscall6", "golang.org/x/net/http2.(*serverConn).writeFrameAsync"}, "x/net and TLS"},
		// A create pays for everything under it, the cache's part included.
		{[]string{"runtime.memmove", "github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher.(*Cacher).Create",
			"k8s.io/apiserver/pkg/endpoints/handlers.CreateResource.createHandler.func1"}, "creates"},
		{[]string{"runtime.mallocgc", "k8s.io/apiserver/pkg/server/filters.(*timeoutHandler).ServeHTTP.func1"}, "creates"},
		// The innermost owner: the copy into x/net's buffer the cache asked for.
		{[]string{"runtime.memmove", "bufio.(*Writer).Write", "golang.org/x/net/http2.(*responseWriter).Write",
			"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object.(*Caching).CacheEncode",
			"k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP"}, "x/net and TLS"},
		{[]string{"encoding/json.Marshal", "k8s.io/apiserver/pkg/endpoints/handlers.(*watchEncoder).typeIdentifier"}, "generic server and watch handler"},
		{[]string{"k8s.io/apiserver/pkg/storage/cacher.(*cacheWatcher).processInterval"}, "cache"},
		{[]string{"google.golang.org/grpc/internal/transport.(*http2Client).reader"}, "etcd client"},
		{[]string{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker"}, "garbage collector"},
		{[]string{"runtime.futex", "runtime.findRunnable", "runtime.schedule", "runtime.mcall"}, "Go scheduler and runtime"},
		{[]string{"time.now"}, "other"},
	} {
		if got := owner(tc.frames); got != tc.want {
			t.Errorf("owner(%q) = %q, want %q", tc.frames, got, tc.want)
		}
	}
}
