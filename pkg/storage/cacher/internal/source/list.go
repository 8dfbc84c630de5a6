package source

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// ListPageSize is the default page size of the cache's own lists from etcd, as
// upstream's reflector pages its initial list.
const ListPageSize = 10000

// ListPageBytes is the default bound on the bytes of the objects in a page
// read at once (listSplit), as the first page's objects measure them. A
// page is held several times over while it is built (etcd's response, the
// decoded objects, their encodes, the packed bytes), and the free heap that
// leaves stays in the RSS. 10,000 objects of 10 KiB, read as two pages of
// 4,500 at once, left 214 MiB of it after a start; pages of 1,500 left 104
// (upstream 33), and the start was 9% faster. Objects of 1 KiB fill pages
// of ListPageSize within it, as before.
const ListPageBytes = 16 << 20

// firstListPage is the size of the first page of the cache's own lists
// when the rest can be read at once (listSplit): small, so that a list of
// a few thousand objects is decoded on every CPU too.
const firstListPage = 1000

// errUnreadable marks an object a list read and could not build.
var errUnreadable = errors.New("an object does not decode")

// listAt reads every object at revision rev, or at the current one for 0.
// With share, an object at the version the store holds is the store's
// object, not a copy built anew: see held.
//
// With a KeyReader it pins the revision first, then reads the first page
// and the keys at once: the keys tell listSplit where the other pages
// start, and the first page how large their objects are. Read one after
// the other, at 10,000 objects the keys took 24 ms after the first page
// with a CPU idle (a runtime trace); read at once, a start is ready 20 ms
// sooner (docs/benchmarks.md).
func (s *Source) listAt(ctx context.Context, rev uint64, share bool) ([]*object.Object, uint64, error) {
	opts := storage.ListOptions{
		Recursive: true,
		Predicate: storage.SelectionPredicate{Label: labels.Everything(), Field: fields.Everything(), Limit: s.cfg.ListPageSize},
	}
	if s.cfg.Keys == nil {
		return s.listPages(ctx, opts, rev, share)
	}
	if rev == 0 {
		var err error
		if rev, err = s.cfg.Store.GetCurrentResourceVersion(ctx); err != nil {
			return nil, 0, fmt.Errorf("reading %s's revision: %w", s.cfg.GroupResource, err)
		}
	}
	opts.Predicate.Limit = min(opts.Predicate.Limit, firstListPage)
	opts.ResourceVersion = strconv.FormatUint(rev, 10)
	opts.ResourceVersionMatch = metav1.ResourceVersionMatchExact
	keysCtx, cancelKeys := context.WithCancel(ctx)
	defer cancelKeys()
	var keys []keyRev
	var keysErr error
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, keysErr = s.readKeys(keysCtx, int64(rev), func(key string, modRev int64) { keys = append(keys, keyRev{key, modRev}) })
	}()
	page, _, next, err := s.listPage(ctx, opts, share)
	if err != nil || next == "" {
		// The keys are not needed.
		cancelKeys()
		<-read
		if err != nil {
			return nil, 0, err
		}
		return page, rev, nil
	}
	<-read
	if keysErr != nil {
		return nil, 0, fmt.Errorf("listing %s's keys: %w", s.cfg.GroupResource, keysErr)
	}
	if len(page) > 0 {
		last := page[len(page)-1].Key
		keys = keys[sort.Search(len(keys), func(i int) bool { return keys[i].key > last }):]
	}
	rest, err := s.listSplit(ctx, opts, rev, keys, meanSize(page), share)
	if err != nil {
		return nil, 0, err
	}
	return append(page, rest...), rev, nil
}

// listPages reads every object at revision rev, or at the current one for
// 0, page after page; with share, as listAt.
func (s *Source) listPages(ctx context.Context, opts storage.ListOptions, rev uint64, share bool) ([]*object.Object, uint64, error) {
	if rev > 0 {
		opts.ResourceVersion = strconv.FormatUint(rev, 10)
		opts.ResourceVersionMatch = metav1.ResourceVersionMatchExact
	}
	var objs []*object.Object
	for {
		var page []*object.Object
		var rv uint64
		var next string
		read := func() (err error) {
			page, rv, next, err = s.listPage(ctx, opts, share)
			return err
		}
		var err error
		if opts.Predicate.Continue == "" {
			err = read() // a failed first page costs nothing to read again
		} else {
			err = s.retryPage(ctx, "after the continue token "+opts.Predicate.Continue, read)
		}
		if err != nil {
			return nil, 0, err
		}
		objs = append(objs, page...)
		if next == "" {
			return objs, rv, nil
		}
		// Continue tokens carry their revision.
		opts.Predicate.Continue = next
		opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	}
}

// listPage reads one page of a list from the underlying store, and returns
// its objects, its revision and its continue token; with share, as listAt.
func (s *Source) listPage(ctx context.Context, opts storage.ListOptions, share bool) ([]*object.Object, uint64, string, error) {
	list := s.cfg.NewListFunc()
	if err := inject.Hit(ctx, inject.ListPageBefore); err != nil {
		return nil, 0, "", fmt.Errorf("listing %s: %w", s.cfg.GroupResource, err)
	}
	if err := s.cfg.Store.GetList(ctx, s.cfg.ResourcePrefix, opts, list); err != nil {
		return nil, 0, "", fmt.Errorf("listing %s: %w", s.cfg.GroupResource, err)
	}
	if err := inject.Hit(ctx, inject.ListPageAfter); err != nil {
		return nil, 0, "", fmt.Errorf("listing %s: %w", s.cfg.GroupResource, err)
	}
	var objs []*object.Object
	err := meta.EachListItem(list, func(item runtime.Object) error {
		if stored, ok := item.(*object.StoredItem); ok {
			// Its object and value are garbage once it is built.
			defer func() { *stored = object.StoredItem{} }()
		}
		if share {
			if o := s.held(item); o != nil {
				objs = append(objs, o)
				return nil
			}
		}
		o, err := s.cfg.Build.Build(item)
		if err != nil {
			return fmt.Errorf("%w: %w", errUnreadable, err)
		}
		objs = append(objs, o)
		return nil
	})
	if err != nil {
		return nil, 0, "", err
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return nil, 0, "", err
	}
	rv, err := s.cfg.Versioner.ParseResourceVersion(lm.GetResourceVersion())
	if err != nil {
		return nil, 0, "", err
	}
	return objs, rv, lm.GetContinue(), nil
}

// held returns the store's object for item if the store holds item's key
// at item's resourceVersion: the same object version, which a list or a
// replay of etcd's history need not build again. After a start most of the
// history a warm start replays, and most of the state it replays it from,
// are such versions. Building each anew encoded a second copy of every
// object in the backfill's list: the RSS after a warm start of 100,000
// objects of 1 KiB was 815 MiB with them and is 601 without (upstream's
// 487; MEMORY_ALT make bench-memory, medians of 3).
func (s *Source) held(item runtime.Object) *object.Object {
	key, err := s.cfg.Build.Key(item)
	if err != nil {
		return nil
	}
	rv, err := s.cfg.Versioner.ObjectResourceVersion(item)
	if err != nil {
		return nil
	}
	if o, ok := s.cfg.Objects.Get(key); ok && o.RV == rv {
		return o
	}
	return nil
}

// meanSize returns the mean length of objs' bytes, uncompressed, at least 1.
func meanSize(objs []*object.Object) int {
	total := 0
	for _, o := range objs {
		total += o.Len()
	}
	return max(1, total/max(1, len(objs)))
}
