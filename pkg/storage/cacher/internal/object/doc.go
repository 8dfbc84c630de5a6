// Package object is the cache's object: one version of a stored object as
// its encoded bytes plus what selectors read (Object), made by a Builder,
// from the value etcd held where the cache's own lists kept it
// (StoredList); the codec that decodes the bytes and learns which response
// encoders write them (Codec); and what watchers are sent, whose encodings
// are made once and shared while an Expiry keeps them (Caching).
//
// It knows nothing of the cache: the store, the history and the fan-out
// hold and pass Objects, and this package imports none of them.
package object
