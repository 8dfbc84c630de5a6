// Package source is everything the watch cache reads from etcd.
//
// A Source lists the resource (list.go; after a first page, the rest in
// pages read at once, split by the keys read without values, each page a
// range of its own keys read straight from etcd: split.go, keys.go,
// ranges.go), hands the state to the cache's Sink, and follows etcd from that
// revision (follower.go) on etcd's own watch, whose responses hold whole
// revisions (changes.go, etcd_changes.go): it re-watches from the cache's
// head whenever a watch ends without losing history, finds a watch gone
// silent (asking for progress, then closing the connections as quiet:
// silence.go), and lists again only when it must (End). Each revision's
// changes become object versions and fan-out events, handed to the sink
// together (ingest.go), with revisions etcd's client delivers again
// dropped. Behind a warm start it fills the history from etcd's
// (backfill.go), and now and then it compares the cache's keys with etcd's
// (check.go). It sets the cache's Readiness (readiness.go).
//
// The source knows the cache only through Sink, Objects and History: the
// fan-out's dispatcher, the store and the history, which its tests fake.
package source
