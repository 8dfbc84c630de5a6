//go:build storechanges

package cacher

import "github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/source"

// A build with the storechanges tag follows the etcd3 store's Watch, for
// the A/B that chose etcd's own watch (internal/source/store_changes.go).
func init() {
	storeChanges = func(c *Config) source.Changes {
		return &source.StoreChanges{Store: c.Storage.(source.WatchStore), Prefix: c.ResourcePrefix, KeyFunc: c.KeyFunc,
			Versioner: c.Versioner}
	}
}
