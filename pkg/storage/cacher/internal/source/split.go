package source

import (
	"context"
	"fmt"
	goruntime "runtime"

	"golang.org/x/sync/errgroup"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// listSplit reads the objects of keys, the resource's keys at revision rev
// in key order, (with share, as listAt) in pages read at once by as many
// goroutines as the process has CPUs: at least one page per CPU, and pages
// of at most Config.ListPageSize objects and, for objects of size bytes on
// average, of Config.ListPageBytes. Each page is a list from the
// underlying store with a continue token made for its first key.
//
// The store decodes a page in the goroutine that asks for it, and decoding
// is most of a start: 4.5 of 6 s at 100,000 objects of 1 KiB, read page
// after page on one core while the others waited. Upstream's reflector
// reads its pages one after another.
func (s *Source) listSplit(ctx context.Context, opts storage.ListOptions, rev uint64, keys []string, size int, share bool) ([]*object.Object, error) {
	cpus := goruntime.GOMAXPROCS(0)
	per := max(1, min(int(s.cfg.ListPageSize), int(s.cfg.ListPageBytes)/size, (len(keys)+cpus-1)/cpus))
	opts.Predicate.Limit = int64(per)
	var starts []string
	for i := 0; i < len(keys); i += per {
		starts = append(starts, keys[i])
	}
	prefix, err := storage.PrepareKey(s.cfg.ResourcePrefix, s.cfg.ResourcePrefix, true)
	if err != nil {
		return nil, err
	}
	// Continue tokens carry their revision.
	opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	pages := make([][]*object.Object, len(starts))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cpus)
	for i, start := range starts {
		g.Go(func() error {
			page := opts
			var err error
			if page.Predicate.Continue, err = storage.EncodeContinue(start, prefix, int64(rev)); err != nil {
				return err
			}
			pages[i], _, _, err = s.listPage(gctx, page, share)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	objs := make([]*object.Object, 0, len(keys))
	for _, page := range pages {
		objs = append(objs, page...)
	}
	// Every page is at rev, so together they hold exactly the keys read.
	if len(objs) != len(keys) {
		return nil, fmt.Errorf("listing %s at revision %d: %d keys, but %d objects in their pages", s.cfg.GroupResource, rev, len(keys), len(objs))
	}
	return objs, nil
}
