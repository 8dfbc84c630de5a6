// Package fanout is the watch cache's fan-out: the dispatcher that applies
// each event to the store and the history and offers it to the watchers
// its index finds for it; the watchers, synced or catching up from the
// history through their own cursor, so that a slow one is never closed for
// being slow; their filters; bookmarks, the shutdown bookmark and waits for
// freshness; and the Event the source hands it.
//
// It imports the store, the history, the object and the gates, and nothing
// of the cache's façade, which wires it to its source.
package fanout
