// Package cacher is the watch cache: a storage.Interface that serves every
// list and watch of one resource from memory, with one etcd watch however
// many clients watch, and passes writes to the etcd3 store it wraps.
//
// # Data flow
//
//	etcd ──► source ──────────► dispatcher ──┬─► store     (internal/store: current objects, snapshots by resourceVersion)
//	   (internal/source:        (internal/   ├─► history   (internal/history: recent events, by resourceVersion)
//	    list, follow, ingest,    fanout)     └─► watchers  (internal/fanout's index, internal/shard: those an event matches)
//	    backfill, check;                              └─► client
//	    internal/object;
//	    internal/etcdconn)
//
// Each stage:
//   - The source lists etcd once, then watches it from that revision; it
//     re-watches from its head after the watch ends or goes silent (closing
//     the etcd connections gone as quiet first), backfills history after a
//     warm start, and compares keys with etcd now and then.
//   - Ingest (in the source) turns each etcd event into an object version: its encoded bytes
//     plus what selectors read, with shard hashes and shared label sets
//     (internal/object, whose Builder makes them).
//   - The dispatcher (internal/fanout) applies an event to the store and the
//     history under one lock, and hands it to the watchers its index finds
//     for it; a watcher that falls behind reads the history through its own
//     cursor, so a slow watcher is never closed for being slow. The fan-out
//     also sends bookmarks and the shutdown bookmark, and makes readers that
//     need a fresher cache wait for the head.
//   - Lists read a snapshot of the store at their resourceVersion (list.go);
//     watch-lists stream the snapshot and then join the fan-out
//     (the gate package bounds and paces them, and bounds large lists).
//   - Responses are the object's bytes where the client's encoding matches
//     them, and decoded and encoded once per object version and encoding
//     otherwise (internal/object: Codec, Caching).
//   - With Config.Compression, the packer (internal/packer) compresses each
//     object version in place once it is older than the history window
//     (internal/compress), in the background; every read goes through
//     Object.Bytes, which decompresses, lists straight into the response
//     (compression.go).
//
// # Lock order
//
// The dispatcher's mutex, then the store's or the history's; nothing is taken
// while holding either of those two. Every other mutex (interner, object
// codec, encodings, encoding expiry, readiness, shutdown) guards its own
// struct and is released before its holder calls into anything else.
package cacher
