// Package gate bounds how many watchers stream their initial events at
// once, across every cache that shares a gate (InitialEvents): first come
// first served, and a nil gate bounds nothing.
//
// The server builds one and gives it to every resource's cache
// (cacher.Config). The package imports nothing of the cache: a watcher is
// its event channel and its done channel (Stream).
package gate
