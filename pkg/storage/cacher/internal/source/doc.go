// Package source is what the watch cache reads from etcd after its list:
// the Follower watches the etcd3 store from a revision, re-watches from the
// cache's head whenever a watch ends without losing history, finds a watch
// gone silent (asking for progress, then closing the connections as quiet)
// and tells the cache when it must list again instead (End, Classify).
//
// The cache's list, warm-start backfill and consistency check are still in
// the façade; they are this package's next parts.
package source
