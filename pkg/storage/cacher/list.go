package cacher

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/fanout"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// GetList implements storage.Interface. See docs/architecture.md for where
// each kind of list is served from.
//
//   - resourceVersion unset: a consistent read from the cache, once it holds
//     etcd's current revision.
//   - "0": the cache's current state.
//   - NotOlderThan N: the current state once the cache has reached N.
//   - Exact N: the snapshot at N, or etcd when the cache no longer holds it.
//   - continue: the snapshot the first page used, or etcd.
//
// limit is honoured in every case, "0" included.
func (c *Cacher) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	rv, err := c.parseRV(opts.ResourceVersion)
	if err != nil {
		return err
	}
	if err := c.ready.Check(c.what()); err != nil {
		if c.cfg.ConsistentReadFallback {
			return c.cfg.Storage.GetList(ctx, key, opts, listObj)
		}
		return err
	}
	asked := key
	if key, err = storage.PrepareKey(c.cfg.ResourcePrefix, key, opts.Recursive); err != nil {
		return err
	}
	// withRev > 0 asks for the state at exactly that resourceVersion: Exact,
	// a continue token, or the legacy "N with a limit".
	withRev, fromKey, err := storage.ValidateListOptions(key, c.cfg.Versioner, opts)
	if err != nil {
		return err
	}
	pred := opts.Predicate
	continuing := opts.Recursive && pred.Continue != ""
	f, err := fanout.NewFilter(pred)
	if err != nil {
		return err
	}

	var snap store.Snapshot
	switch {
	case withRev > 0:
		if err := c.d.WaitFor(ctx, uint64(withRev), c.cfg.FreshnessTimeout, c.requestProgress); err != nil {
			return err
		}
		var ok bool
		if snap, ok = c.snapshotAt(uint64(withRev)); !ok {
			// Another replica's token, or a state older than our snapshots:
			// etcd serves it, or answers 410 (with a fresh token for a continue).
			return c.cfg.Storage.GetList(ctx, key, opts, listObj)
		}
	case continuing || opts.ResourceVersion == "":
		// A consistent read; a continue token with a negative
		// resourceVersion asks for one too, as etcd3 serves it.
		if err := c.waitConsistent(ctx); err != nil {
			fallback := c.cfg.ConsistentReadFallback && apierrors.IsTooManyRequests(err)
			c.metrics.consistentRead(false, fallback)
			if fallback {
				return c.cfg.Storage.GetList(ctx, key, opts, listObj)
			}
			return err
		}
		c.metrics.consistentRead(true, false)
		snap = c.store.Latest()
	default:
		// "0", or NotOlderThan N.
		if rv > 0 {
			if err := c.d.WaitFor(ctx, rv, c.cfg.FreshnessTimeout, c.requestProgress); err != nil {
				return err
			}
		}
		snap = c.store.Latest()
	}
	if !continuing {
		fromKey = ""
	}
	if pred.Limit == 0 && !continuing && withRev == 0 {
		if done, err := c.listByIndex(ctx, key, opts.Recursive, &pred, f, listObj); done || err != nil {
			return c.notCorrupt(err, func() error { return c.cfg.Storage.GetList(ctx, asked, opts, listObj) })
		}
	}
	err = c.listFrom(ctx, snap, key, opts.Recursive, f, pred.Limit, fromKey, listObj)
	return c.notCorrupt(err, func() error { return c.cfg.Storage.GetList(ctx, asked, opts, listObj) })
}

// notCorrupt returns err, unless a compressed object the read decoded was
// corrupt (object.ErrCorrupt): the read, which has written nothing yet, is
// then served by etcd, with fromEtcd, while the cache lists again
// (Cacher.corrupted). A list whose items the response writes from the
// cache's bytes (SharingList) finds a corrupt one only as it writes it:
// the response ends there, short.
func (c *Cacher) notCorrupt(err error, fromEtcd func() error) error {
	if errors.Is(err, object.ErrCorrupt) {
		return fromEtcd()
	}
	return err
}

// snapshotAt returns the state at exactly rv, unless etcd has compacted rv
// away: then etcd must answer, with 410.
func (c *Cacher) snapshotAt(rv uint64) (store.Snapshot, bool) {
	if int64(rv) < c.cfg.Storage.CompactRevision() {
		return store.Snapshot{}, false
	}
	return c.d.At(rv)
}

// listByIndex serves an unpaginated list of the current state through an
// index the selector can use. done is false when no index applies.
func (c *Cacher) listByIndex(ctx context.Context, key string, recursive bool, pred *storage.SelectionPredicate, f *fanout.Filter, listObj runtime.Object) (done bool, err error) {
	for _, m := range pred.MatcherIndex(ctx) {
		objs, rv, ok := c.store.ByIndex(m.IndexName, m.Value)
		if !ok {
			continue
		}
		matched := make([]*object.Object, 0, len(objs))
		for _, o := range objs {
			if fanout.InScope(key, recursive, o.Key) && f.Matches(o, c.pres, nil) {
				matched = append(matched, o)
			}
		}
		if err := setItems(listObj, matched); err != nil {
			return true, err
		}
		c.metrics.list(m.IndexName, len(objs), len(matched))
		f.SetShardInfo(listObj)
		return true, c.cfg.Versioner.UpdateList(listObj, rv, "", nil)
	}
	return false, nil
}

// listFrom fills listObj with one page of up to limit objects from snap
// that pass f, starting at fromKey, and sets the continue token, the
// remaining count and, for a sharded list, the shard info.
func (c *Cacher) listFrom(ctx context.Context, snap store.Snapshot, key string, recursive bool, f *fanout.Filter, limit int64, fromKey string, listObj runtime.Object) error {
	var (
		count            int64
		fetched          int
		lastKey, nextKey string
		more             bool
		matched          []*object.Object
		err              error
	)
	if limit > 0 {
		// The page holds at most what the snapshot holds: a client's limit
		// is not an allocation size (limit=2^63-1 made the server panic).
		matched = make([]*object.Object, 0, min(limit, int64(snap.Len())))
	}
	empty := f.Empty()
	snap.Scan(key, recursive, fromKey, func(o *object.Object) bool {
		if limit > 0 && count == limit {
			// Anything left in range means another page, even if it may
			// not match, as etcd3 answers.
			more, nextKey = true, o.Key
			return false
		}
		fetched++
		if !f.Matches(o, c.pres, nil) {
			return true
		}
		matched = append(matched, o)
		count++
		lastKey = o.Key
		return true
	})
	if inject.On(inject.ListMissesRevisionEvent) {
		matched = missOneOfRevision(matched, snap.RV)
	}
	if err := setItems(listObj, matched); err != nil {
		return err
	}
	c.metrics.list("", fetched, int(count))
	var continueToken string
	var remainingCount *int64
	if more {
		if continueToken, err = storage.EncodeContinue(lastKey+"\x00", key, int64(snap.RV)); err != nil {
			return err
		}
		if empty {
			// remainingItemCount is set only without selectors, as etcd3
			// does: what is left in range, counted without reading it.
			remaining := int64(snap.Count(key, nextKey))
			remainingCount = &remaining
		}
	}
	f.SetShardInfo(listObj)
	return c.cfg.Versioner.UpdateList(listObj, snap.RV, continueToken, remainingCount)
}

// missOneOfRevision leaves out of objs the first object written at rv, if
// rv wrote several of them: the bug a faultinject build injects.
func missOneOfRevision(objs []*object.Object, rv uint64) []*object.Object {
	first, n := -1, 0
	for i, o := range objs {
		if o.RV == rv {
			n++
			if first < 0 {
				first = i
			}
		}
	}
	if n < 2 {
		return objs
	}
	return append(objs[:first:first], objs[first+1:]...)
}

// SharingList is a list that takes the cached objects themselves, read-only,
// instead of decoded copies of them in its Items. A list of 100,000 objects
// that is only encoded and dropped then costs its server 16 bytes per
// object, and no decoding. Each item's DeepCopyObject is its decoded copy,
// and it implements
//
//	ListItem(id runtime.Identifier, encode func(runtime.Object, io.Writer) error) (open []byte, n int, ok bool)
//	AppendItem(dst []byte) ([]byte, error)
//
// which tell whether the item's bytes are its item in a list that encoder
// writes, and append them, decompressed straight into dst where the cache
// keeps them compressed (see object.ListItem). pkg/registry's lists
// implement SharingList; a list that does not gets decoded copies.
type SharingList interface {
	runtime.Object
	// ShareItems hands over the list's objects, in order. The list must
	// not change them, nor what they point to.
	ShareItems(objs []runtime.Object)
}

// setItems fills a list's Items with objs. A SharingList gets the
// objects themselves, whose bytes its response writes; any other list
// gets decoded copies, as etcd3 fills it.
func setItems(listObj runtime.Object, objs []*object.Object) error {
	if l, ok := listObj.(SharingList); ok {
		shared := make([]runtime.Object, len(objs))
		for i, o := range objs {
			shared[i] = o
		}
		l.ShareItems(shared)
		return nil
	}
	ptr, err := meta.GetItemsPtr(listObj)
	if err != nil {
		return err
	}
	v := reflect.ValueOf(ptr).Elem()
	if v.Kind() != reflect.Slice {
		return fmt.Errorf("items of %T are not a slice", listObj)
	}
	// An empty list has empty, not nil, items, as etcd3 returns them.
	items := reflect.MakeSlice(v.Type(), len(objs), len(objs))
	ptrs := v.Type().Elem().Kind() == reflect.Pointer
	for i, o := range objs {
		obj, err := o.Decode()
		if err != nil {
			return err
		}
		src := reflect.ValueOf(obj)
		if !ptrs {
			src = src.Elem()
		}
		items.Index(i).Set(src)
	}
	v.Set(items)
	return nil
}

// Get implements storage.Interface.
//
//   - resourceVersion unset: a consistent read, from etcd. One key costs etcd
//     what the revision read of a cached consistent read would.
//   - "0": whatever the cache holds.
//   - N: the cache's state once it has reached N, waiting up to
//     FreshnessTimeout, then 504 with the ResourceVersionTooLarge cause.
func (c *Cacher) Get(ctx context.Context, key string, opts storage.GetOptions, objPtr runtime.Object) error {
	if opts.ResourceVersion == "" {
		return c.cfg.Storage.Get(ctx, key, opts, objPtr)
	}
	rv, err := c.parseRV(opts.ResourceVersion)
	if err != nil {
		return err
	}
	if _, err := storage.PrepareKey(c.cfg.ResourcePrefix, key, false); err != nil {
		return err
	}
	if err := c.ready.Check(c.what()); err != nil {
		if c.cfg.ConsistentReadFallback {
			return c.cfg.Storage.Get(ctx, key, opts, objPtr)
		}
		return err
	}
	if rv > 0 {
		if err := c.d.WaitFor(ctx, rv, c.cfg.FreshnessTimeout, c.requestProgress); err != nil {
			return err
		}
	}
	o, ok := c.store.Get(key)
	if !ok {
		if opts.IgnoreNotFound {
			return runtime.SetZeroValue(objPtr)
		}
		_, head := c.log.Bounds()
		return storage.NewKeyNotFoundError(key, int64(head))
	}
	return c.notCorrupt(o.DecodeInto(objPtr), func() error { return c.cfg.Storage.Get(ctx, key, opts, objPtr) })
}
