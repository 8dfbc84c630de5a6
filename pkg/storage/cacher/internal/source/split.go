package source

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"golang.org/x/sync/errgroup"
	grpccodes "google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// keyRev is a key and the revision it was last modified at.
type keyRev struct {
	key    string
	modRev int64
}

// heldGap is how many keys the store holds there must be between two runs
// of keys it does not for listSplit to read the runs apart. A read is a
// request to etcd and a list through the etcd3 store, which cost more
// than decoding the few held objects between two runs: with 30% of 20,000
// objects updated at random, reading every run apart took a warm start's
// CPU from 1,245 to 2,625 ms (docs/benchmarks.md).
const heldGap = 16

// listSplit reads the objects of keys, the resource's keys at revision rev
// in key order (with share, as listAt), in pages read at once by as many
// goroutines as the process has CPUs: at least one page per CPU, and pages
// of at most Config.ListPageSize objects and, for objects of size bytes on
// average, of Config.ListPageBytes. Each page is read with Config.Ranges,
// up to the next page's first key (readRange), or without it as a list
// from the underlying store with a continue token made for its first key.
//
// The store decodes a page in the goroutine that asks for it, and decoding
// is most of a start: 4.5 of 6 s at 100,000 objects of 1 KiB, read page
// after page on one core while the others waited. Upstream's reflector
// reads its pages one after another.
//
// With share, an object the store holds at its key's revision is the
// store's, and is not read: a warm start's backfill lists an older state
// whose objects are mostly unchanged since, and read, each was decoded
// only to be found held. Only the runs of keys the store does not hold
// are read: a warm start over 20,000 objects with 10,000 held takes 990 ms
// of CPU instead of 1,255.
func (s *Source) listSplit(ctx context.Context, opts storage.ListOptions, rev uint64, keys []keyRev, size int, share bool) ([]*object.Object, error) {
	objs := make([]*object.Object, len(keys))
	// runs are [from, to) ranges of keys to read, in order.
	var runs [][2]int
	for i, k := range keys {
		if share {
			if o, ok := s.cfg.Objects.Get(k.key); ok && o.RV == uint64(k.modRev) {
				objs[i] = o
				continue
			}
		}
		if n := len(runs); n > 0 && i-runs[n-1][1] < heldGap {
			runs[n-1][1] = i + 1
		} else {
			runs = append(runs, [2]int{i, i + 1})
		}
	}
	toRead := 0
	for _, r := range runs {
		toRead += r[1] - r[0]
	}
	cpus := goruntime.GOMAXPROCS(0)
	per := max(1, min(int(s.cfg.ListPageSize), int(s.cfg.ListPageBytes)/size, (toRead+cpus-1)/cpus))
	var pages [][2]int
	for _, r := range runs {
		for from := r[0]; from < r[1]; from += per {
			pages = append(pages, [2]int{from, min(from+per, r[1])})
		}
	}
	prefix, err := storage.PrepareKey(s.cfg.ResourcePrefix, s.cfg.ResourcePrefix, true)
	if err != nil {
		return nil, err
	}
	// Continue tokens carry their revision.
	opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cpus)
	for _, p := range pages {
		g.Go(func() error {
			// A page queued behind the limit after another failed reads
			// nothing: the list has failed.
			if err := gctx.Err(); err != nil {
				return err
			}
			page := opts
			page.Predicate.Limit = int64(p[1] - p[0])
			if s.cfg.Ranges == nil {
				var err error
				if page.Predicate.Continue, err = storage.EncodeContinue(keys[p[0]].key, prefix, int64(rev)); err != nil {
					return err
				}
			}
			var read []*object.Object
			err := s.retryPage(gctx, "from "+keys[p[0]].key, func() (err error) {
				if s.cfg.Ranges != nil {
					read, err = s.readRange(gctx, rev, keys, p, share)
				} else {
					read, _, _, err = s.listPage(gctx, page, share)
				}
				return err
			})
			if err != nil {
				return err
			}
			// The page is at rev, so it holds exactly its keys.
			for i, o := range read {
				if i >= p[1]-p[0] || o.Key != keys[p[0]+i].key {
					return fmt.Errorf("listing %s at revision %d: %s in a page of the keys from %s", s.cfg.GroupResource, rev, o.Key, keys[p[0]].key)
				}
				objs[p[0]+i] = o
			}
			if len(read) != p[1]-p[0] {
				return fmt.Errorf("listing %s at revision %d: %d of %d keys from %s in their page", s.cfg.GroupResource, rev, len(read), p[1]-p[0], keys[p[0]].key)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return objs, nil
}

// readRange reads page p of keys at rev with Config.Ranges, up to the key
// after it: with share, as listAt, an object the store holds at its key's
// revision is the store's, and is not decoded.
func (s *Source) readRange(ctx context.Context, rev uint64, keys []keyRev, p [2]int, share bool) ([]*object.Object, error) {
	to := ""
	if p[1] < len(keys) {
		to = keys[p[1]].key
	}
	objs := make([]*object.Object, 0, p[1]-p[0])
	err := s.cfg.Ranges.ReadRange(ctx, int64(rev), keys[p[0]].key, to, func(key string, modRev int64, read func() (runtime.Object, error)) error {
		if share {
			if o, ok := s.cfg.Objects.Get(key); ok && o.RV == uint64(modRev) {
				objs = append(objs, o)
				return nil
			}
		}
		item, err := read()
		if errors.As(err, new(transformError)) {
			// Not unreadable: a later list may get past it, as past
			// the etcd3 store's failures.
			return fmt.Errorf("%s at revision %d: %w", key, modRev, err)
		}
		if err == nil {
			var o *object.Object
			if o, err = s.cfg.Build.Build(item); err == nil {
				objs = append(objs, o)
				return nil
			}
		}
		return fmt.Errorf("%w: %s at revision %d: %w", errUnreadable, key, modRev, err)
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", s.cfg.GroupResource, err)
	}
	return objs, nil
}

// pageRetries bounds how many times retryPage reads a page again: with
// its waits, about 16 s, a member's restart or an election. A failure
// that outlasts it fails the list, which Run reads again whole at a new
// revision.
const pageRetries = 8

// retryPage calls read, which reads the page of a list named by page,
// until it succeeds, up to pageRetries times again while it fails as etcd
// or the way to it fails and then passes (passes): a member restarting
// mid-stream, a stream cut short, no leader for a while. Between reads it
// waits as Run does between lists, jittered, since every page a restart
// cut retries at once. The pages already read are kept: without it, one
// such failure read the whole list again, at a million objects 11-15 s of
// a start. Any other failure (a compacted revision, an object that does
// not decode or decrypt, ctx's end) fails the list at once, as before.
func (s *Source) retryPage(ctx context.Context, page string, read func() error) error {
	delay := minRetryDelay
	for try := 0; ; try++ {
		err := read()
		if err == nil || try == pageRetries || ctx.Err() != nil || !passes(err) {
			return err
		}
		s.cfg.Metrics.PageRetried.Inc()
		klog.InfoS("Watch cache could not read a page of its list; reading it again", "resource", s.cfg.GroupResource,
			"page", page, "retryIn", delay, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-s.cfg.Clock.After(wait.Jitter(delay, 0.2)):
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// passes tells whether err is etcd's, or the connection's to it, of a
// kind that passes: another read at the same revision may succeed.
func passes(err error) bool {
	if errors.Is(err, errStreamCut) || errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrLeaderChanged) ||
		errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) {
		return true
	}
	// Behind Enabled, so that the server users run holds not even the
	// failure's text (TestServerHoldsNoFailpoint).
	if inject.Enabled && errors.Is(err, inject.ErrFailpoint) {
		return true
	}
	switch grpcstatus.Code(err) {
	case grpccodes.Unavailable, grpccodes.DeadlineExceeded:
		return true
	}
	return false
}
