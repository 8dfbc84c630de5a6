package cacher

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

// listPageSize is the page size of the cache's own lists from etcd, as
// upstream's reflector pages its initial list.
const listPageSize = 10000

// firstListPage is the size of the first page of the cache's own lists
// when the rest can be read at once (listSplit): small, so that a list of
// a few thousand objects is decoded on every CPU too.
const firstListPage = 1000

// Retry delays after a failed list.
const (
	minRetryDelay = 100 * time.Millisecond
	maxRetryDelay = 5 * time.Second
)

// run lists, then follows the underlying store until ctx ends. It lists
// again only when following cannot go on without losing events: see follow.
// The first list, and a re-list after compaction, start warm: see backfill.go.
func (c *Cacher) run(ctx context.Context) {
	defer close(c.done)
	delay := minRetryDelay
	warm := true
	for ctx.Err() == nil {
		start := c.cfg.Clock.Now()
		rv, err := c.list(ctx)
		var end watchEnd
		if err != nil {
			c.metrics.initErrors.Inc()
		} else {
			c.metrics.initializations.Inc()
			c.metrics.initDuration.Observe(c.cfg.Clock.Since(start).Seconds())
			c.ready.set(ready)
			delay = minRetryDelay
			listCtx, cancel := context.WithCancel(ctx)
			if warm {
				c.startBackfill(listCtx, rv)
			}
			end = c.follow(listCtx, rv)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		c.ready.set(pending)
		if err == nil {
			c.metrics.relist(end.reason)
			c.d.endAll(fmt.Sprintf("the watch cache for %s must list again (%v)", c.cfg.GroupResource, end))
			klog.InfoS("Watch cache is re-listing", "resource", c.cfg.GroupResource, "reason", end.reason, "err", end.err)
		}
		// After a compaction the history since it is sound; after an
		// unreadable event or a failed check it may hold the cause.
		warm = err == nil && end.reason == endCompacted
		select {
		case <-ctx.Done():
			return
		case <-c.cfg.Clock.After(delay):
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// list reads every object at the current revision and installs them,
// ending every open watcher: events between its position and the list are
// unknown.
func (c *Cacher) list(ctx context.Context) (uint64, error) {
	// This list answers any re-list the consistency check asked for.
	select {
	case <-c.relistRequests:
	default:
	}
	objs, rv, err := c.listAt(ctx, 0)
	if err != nil {
		return 0, err
	}
	c.d.reset(objs, rv)
	return rv, nil
}

// listAt reads every object at revision rev, or at the current one for 0.
func (c *Cacher) listAt(ctx context.Context, rev uint64) ([]*object, uint64, error) {
	var objs []*object
	var rv uint64
	opts := storage.ListOptions{
		Recursive: true,
		Predicate: storage.SelectionPredicate{Label: labels.Everything(), Field: fields.Everything(), Limit: c.cfg.listPageSize},
	}
	if c.cfg.KeyReader != nil {
		opts.Predicate.Limit = min(opts.Predicate.Limit, firstListPage)
	}
	if rev > 0 {
		opts.ResourceVersion = strconv.FormatUint(rev, 10)
		opts.ResourceVersionMatch = metav1.ResourceVersionMatchExact
	}
	for {
		page, pageRV, next, err := c.listPage(ctx, opts)
		if err != nil {
			return nil, 0, err
		}
		objs, rv = append(objs, page...), pageRV
		if next == "" {
			return objs, rv, nil
		}
		if c.cfg.KeyReader != nil {
			rest, err := c.listSplit(ctx, opts, rv, objs[len(objs)-1].key)
			if err != nil {
				return nil, 0, err
			}
			return append(objs, rest...), rv, nil
		}
		// Continue tokens carry their revision.
		opts.Predicate.Continue = next
		opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	}
}

// listPage reads one page of a list from the underlying store, and returns
// its objects, its revision and its continue token.
func (c *Cacher) listPage(ctx context.Context, opts storage.ListOptions) ([]*object, uint64, string, error) {
	list := c.cfg.NewListFunc()
	if err := c.cfg.Storage.GetList(ctx, c.cfg.ResourcePrefix, opts, list); err != nil {
		return nil, 0, "", fmt.Errorf("listing %s: %w", c.cfg.GroupResource, err)
	}
	var objs []*object
	err := meta.EachListItem(list, func(item runtime.Object) error {
		o, err := c.newObject(item)
		if err == nil {
			objs = append(objs, o)
		}
		return err
	})
	if err != nil {
		return nil, 0, "", err
	}
	packBytes(objs)
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return nil, 0, "", err
	}
	rv, err := c.cfg.Versioner.ParseResourceVersion(lm.GetResourceVersion())
	if err != nil {
		return nil, 0, "", err
	}
	return objs, rv, lm.GetContinue(), nil
}

// ingest turns one etcd event into a cached event. decoded is when the
// etcd3 store decoded it, if it said.
func (c *Cacher) ingest(ev watch.Event, decoded time.Time) error {
	o, err := c.newObject(ev.Object)
	if err != nil {
		return err
	}
	c.metrics.eventsReceived.Inc()
	c.metrics.resourceVersion(o.rv)
	prev, _ := c.store.get(o.key)
	e := &event{key: o.key, rv: o.rv, cur: o, prev: prev, recorded: c.cfg.Clock.Now()}
	if !decoded.IsZero() {
		// The dispatch latency compares real times, as the decode time is.
		e.decoded, e.received = decoded.UnixNano(), time.Now().UnixNano()
	}
	switch {
	case ev.Type == watch.Deleted && prev == nil:
		// Deleting what the cache never held: nothing to tell watchers.
		c.d.progress(o.rv)
		return nil
	case ev.Type == watch.Deleted:
		e.typ = watch.Deleted
	case prev == nil:
		e.typ = watch.Added
	default:
		e.typ = watch.Modified
	}
	c.d.process(e)
	return nil
}

// newObject computes what the cache keeps for an object: its bytes and
// what selectors need. obj is not kept.
func (c *Cacher) newObject(obj runtime.Object) (*object, error) {
	key, err := c.cfg.KeyFunc(obj)
	if err != nil {
		return nil, fmt.Errorf("key of %T: %w", obj, err)
	}
	l, f, err := c.cfg.GetAttrsFunc(obj)
	if err != nil {
		return nil, fmt.Errorf("attributes of %s: %w", key, err)
	}
	rv, err := c.cfg.Versioner.ObjectResourceVersion(obj)
	if err != nil {
		return nil, fmt.Errorf("resourceVersion of %s: %w", key, err)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", key, err)
	}
	raw, err := c.codec.encode(obj)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", key, err)
	}
	o := &object{key: key, name: nameIn(key, m.GetName()), raw: raw, head: typeHeader(raw), codec: c.codec, rv: rv}
	if len(l) > 0 {
		o.labels = c.intern.labels(l)
	}
	if c.cfg.TriggerField != "" {
		o.trigger = c.cfg.IndexerFuncs[c.cfg.TriggerField](obj)
	}
	o.fields = c.intern.fields(f, c.cfg.TriggerField)
	o.hashes[shard.ByUID] = shard.Hash(string(m.GetUID()))
	o.hashes[shard.ByNamespace] = shard.Hash(m.GetNamespace())
	if len(c.indexers) > 0 {
		o.indexed = make([][]string, len(c.indexers))
		for i, ix := range c.indexers {
			values, err := ix.fn(obj)
			if err != nil {
				klog.ErrorS(err, "Indexer failed", "index", ix.name, "key", key)
			}
			o.indexed[i] = values
		}
	}
	return o, nil
}

// nameIn returns name, as the substring of key that ends it if there is
// one, so that the object keeps no second copy.
func nameIn(key, name string) string {
	if strings.HasSuffix(key, "/"+name) {
		return key[len(key)-len(name):]
	}
	return name
}

// namedIndexer is one of Config.Indexers.
type namedIndexer struct {
	name string
	fn   cache.IndexFunc
}

// extraIndexers returns Config.Indexers but the trigger field's, in a
// fixed order: the trigger function and the indexer give the same values,
// and the object keeps the trigger's.
func (c *Cacher) extraIndexers() []namedIndexer {
	var out []namedIndexer
	if c.cfg.Indexers == nil {
		return nil
	}
	for name, fn := range *c.cfg.Indexers {
		if c.cfg.TriggerField != "" && name == storage.FieldIndex(c.cfg.TriggerField) {
			continue
		}
		out = append(out, namedIndexer{name: name, fn: fn})
	}
	slices.SortFunc(out, func(a, b namedIndexer) int { return strings.Compare(a.name, b.name) })
	return out
}

// indexFuncs adapts the indexers, and the trigger field, to the store.
func (c *Cacher) indexFuncs() map[string]func(*object) []string {
	fns := map[string]func(*object) []string{}
	for i, ix := range c.indexers {
		fns[ix.name] = func(o *object) []string { return o.indexed[i] }
	}
	if c.cfg.TriggerField != "" {
		fns[storage.FieldIndex(c.cfg.TriggerField)] = func(o *object) []string { return []string{o.trigger} }
	}
	return fns
}
