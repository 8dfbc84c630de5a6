package cacher

import "github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"

// Shutdown tells every cache built with it that its server is about to end
// every watch, so that each watcher gets a bookmark at the head first; a
// server calls Begin in a pre-shutdown hook (fanout.Shutdown).
type Shutdown = fanout.Shutdown

// NewShutdown returns a Shutdown that has not begun.
func NewShutdown() *Shutdown { return fanout.NewShutdown() }
