package faults

import "testing"

func TestEtcdWatchMetric(t *testing.T) {
	for _, tc := range []struct {
		line string
		want bool
	}{
		{"etcd_debugging_mvcc_watcher_total 3", true},
		{"etcd_debugging_mvcc_slow_watcher_total 0", true},
		{"# HELP etcd_debugging_mvcc_watcher_total Total number of watchers.", false},
		{`grpc_server_handled_total{grpc_code="Canceled",grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"} 9`, true},
		{`grpc_server_handled_total{grpc_code="OK",grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"} 0`, false},
		{`grpc_server_started_total{grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"} 2`, false},
		{"etcd_mvcc_db_total_size_in_bytes 1e+06", false},
	} {
		if got := etcdWatchMetric(tc.line); got != tc.want {
			t.Errorf("etcdWatchMetric(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

// TestStallGoroutines: the report keeps the goroutines of the cache's
// source and etcd's client watch from the server, and etcd's watch streams
// and watchable store from etcd, and nothing else.
func TestStallGoroutines(t *testing.T) {
	for _, tc := range []struct {
		keep  func(string) bool
		stack string
		want  bool
	}{
		{stallGoroutine, "goroutine 1 [select]:\ngithub.com/x/pkg/storage/cacher/internal/source.(*follower).watch(...)", true},
		{stallGoroutine, "goroutine 2 [select]:\ngo.etcd.io/etcd/client/v3.(*watchGRPCStream).run(...)", true},
		{stallGoroutine, "goroutine 3 [IO wait]:\nnet/http.(*conn).serve(...)", false},
		{etcdStallGoroutine, "goroutine 1 [select]:\ngo.etcd.io/etcd/server/v3/etcdserver/api/v3rpc.(*serverWatchStream).sendLoop(...)", true},
		{etcdStallGoroutine, "goroutine 2 [select]:\ngo.etcd.io/etcd/server/v3/storage/mvcc.(*watchableStore).syncWatchersLoop(...)", true},
		{etcdStallGoroutine, "goroutine 3 [select]:\ngo.etcd.io/raft/v3.(*node).run(...)", false},
	} {
		if got := tc.keep(tc.stack); got != tc.want {
			t.Errorf("kept %q: %v, want %v", tc.stack, got, tc.want)
		}
	}
}
