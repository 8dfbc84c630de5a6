// Package gate bounds the work that competes with writes for CPU, across
// every cache that shares a gate: watchers streaming their initial events
// (InitialEvents, which also paces them while the server serves requests
// clients wait on) and large lists (Lists). Each is first come first
// served, and a nil gate bounds nothing.
//
// The server builds one of each and gives them to every resource's cache
// (cacher.Config). The package imports nothing of the cache: a watcher is
// its event channel and its done channel (Stream).
package gate
