package cacher

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	goruntime "runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// The clients of a robustness run, as informers and agents are: each
// syncs (a consistent list, or a watch-list), watches from there, resumes
// from the last resourceVersion it holds whenever a watch ends, and syncs
// again only after a 410. Some read as fast as they can, others take up to
// 2 ms an event; some go back, now and then, to any resourceVersion they
// were handed (a list's, an event's, a bookmark's, a watch-list's end) and
// watch from there. Everything they receive is recorded for the checker.

// rbSelector is what a client selects, and how the checker tells.
type rbSelector struct {
	name  string
	pred  storage.SelectionPredicate
	match func(*rbPod) bool
}

// The predicates carry GetAttrs, as the registry's do: upstream's cache
// hands them to etcd3 while it is not ready.
var rbSelectors = []rbSelector{
	{name: "all", pred: storage.SelectionPredicate{Label: labels.Everything(), Field: fields.Everything(), GetAttrs: podAttrs},
		match: func(*rbPod) bool { return true }},
	{name: "tier=gold", pred: storage.SelectionPredicate{Label: labels.SelectorFromSet(labels.Set{"tier": "gold"}), Field: fields.Everything(),
		GetAttrs: podAttrs}, match: func(p *rbPod) bool { return p.tier == "gold" }},
	{name: "node-1", pred: storage.SelectionPredicate{Label: labels.Everything(), Field: fields.OneTermEqualSelector("spec.nodeName", "node-1"),
		GetAttrs: podAttrs, IndexFields: []string{"spec.nodeName"}},
		match: func(p *rbPod) bool { return p.node == "node-1" }},
}

// rbClient is one watching client.
type rbClient struct {
	name      string
	res       *rbResource
	cache     *rbCache
	sel       rbSelector
	watchList bool
	bookmarks bool
	// pause is how long the consumer takes per event: 0 reads at full
	// speed, negative yields its CPU.
	pause time.Duration
	// rewatchEvery is how many events it reads before it watches again
	// from a resourceVersion it was handed, and rewatchIdle how long it
	// waits for one before it does; 0 never.
	rewatchEvery int
	rewatchIdle  time.Duration
	rnd          *rand.Rand
	acked        func() int64
	// settled, once true, stops the client going back: it reads on to
	// the end of the run.
	settled *atomic.Bool

	// mu guards the records below.
	mu       sync.Mutex
	segments []*watchcheck.Segment
	lists    []watchcheck.List
	// handed holds every resourceVersion the client was handed.
	handed []int64
	// gone records each 410, with the resourceVersion it asked for.
	gone []rbGone
	// closed counts watches that ended without a 410, and failed the
	// attempts to list or watch that failed; lastErr is the last failure.
	closed, failed int
	lastErr        error
	// seen holds the keys the client received or listed.
	seen map[string]bool
}

// rbGone is a 410 a client got: for a watch or list from rev, at time at.
type rbGone struct {
	rev int64
	at  time.Time
	msg string
}

// run syncs and watches until ctx ends.
func (c *rbClient) run(ctx context.Context) {
	from, synced := int64(0), false
	for ctx.Err() == nil {
		if !synced && !c.watchList {
			rev, err := c.list(ctx)
			if err != nil {
				c.noteFailed(err)
				c.backoff(ctx)
				continue
			}
			from, synced = rev, true
		}
		opts := storage.ListOptions{Recursive: true, Predicate: c.sel.pred}
		opts.Predicate.AllowWatchBookmarks = c.bookmarks
		if synced {
			opts.ResourceVersion = strconv.FormatInt(from, 10)
		} else {
			opts.SendInitialEvents = ptr.To(true)
			opts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
			opts.Predicate.AllowWatchBookmarks = true
		}
		w, err := c.cache.get().Watch(ctx, c.res.prefix, opts)
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				c.noteGone(from, err)
				synced = false
				continue
			}
			c.noteFailed(err)
			c.backoff(ctx)
			continue
		}
		next, ok, gone := c.consume(ctx, w, from, synced)
		w.Stop()
		switch {
		case gone:
			synced = false
		case ok:
			from, synced = next, true
		default:
			synced = false // a watch-list that never completed its state
		}
	}
}

// backoff waits before the next attempt, as a client told to retry does.
func (c *rbClient) backoff(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(20 * time.Millisecond):
	}
}

// list lists the selected objects, consistently, and returns the list's
// resourceVersion.
func (c *rbClient) list(ctx context.Context) (int64, error) {
	minRev := c.acked()
	l := &example.PodList{}
	err := c.cache.get().GetList(ctx, c.res.prefix, storage.ListOptions{Recursive: true, Predicate: c.sel.pred}, l)
	if err != nil {
		return 0, err
	}
	rev, items := listItems(c.res.prefix, l)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lists = append(c.lists, watchcheck.List{Who: c.name, Rev: rev, Items: items, MinRev: minRev})
	c.handed = append(c.handed, rev)
	for k := range items {
		c.seen[k] = true
	}
	return rev, nil
}

// listItems returns a list's resourceVersion and its items' keys and
// resourceVersions.
func listItems(prefix string, l *example.PodList) (int64, map[string]int64) {
	rev, _ := strconv.ParseInt(l.ResourceVersion, 10, 64)
	items := map[string]int64{}
	for _, p := range l.Items {
		rv, _ := strconv.ParseInt(p.ResourceVersion, 10, 64)
		items[prefix+p.Namespace+"/"+p.Name] = rv
	}
	return rev, items
}

func (c *rbClient) noteFailed(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed++
	c.lastErr = err
}

// describe says where the client is, for a violation's reader.
func (c *rbClient) describe() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	last := "none"
	if n := len(c.segments); n > 0 {
		seg := c.segments[n-1]
		last = fmt.Sprintf("from %d, %d items", seg.From, len(seg.Items))
		if k := len(seg.Items); k > 0 {
			last += fmt.Sprintf(", the last %+v", seg.Items[k-1])
		}
	}
	return fmt.Sprintf("%d segments (the last %s), %d lists, %d 410s, %d closed, %d failed (the last: %v)",
		len(c.segments), last, len(c.lists), len(c.gone), c.closed, c.failed, c.lastErr)
}

func (c *rbClient) noteGone(rev int64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = append(c.gone, rbGone{rev: rev, at: time.Now(), msg: err.Error()})
}

// consume reads one watch until it ends, or until the client goes back to
// another resourceVersion. It returns the resourceVersion to resume from
// and whether there is one, and whether the watch ended with a 410.
func (c *rbClient) consume(ctx context.Context, w watch.Interface, from int64, synced bool) (next int64, ok, gone bool) {
	seg := &watchcheck.Segment{From: from}
	var initial map[string]int64
	if synced {
		c.addSegment(seg)
	} else {
		initial = map[string]int64{}
	}
	last, events := from, 0
	var idle <-chan time.Time
	for {
		if synced && c.rewatchIdle > 0 && idle == nil {
			idle = time.After(c.rewatchIdle)
		}
		var ev watch.Event
		var open bool
		select {
		case <-ctx.Done():
			seg.Cut = true
			return last, synced, false
		case <-idle:
			if c.settled.Load() {
				continue
			}
			// Quiet for a while: go back to a resourceVersion it holds.
			seg.Cut = true
			return c.pickHanded(), true, false
		case ev, open = <-w.ResultChan():
			idle = nil
		}
		if !open {
			c.mu.Lock()
			c.closed++
			c.mu.Unlock()
			return last, synced, false
		}
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				c.noteGone(from, err)
				return 0, false, true
			}
			return last, synced, false
		}
		m, err := meta.Accessor(ev.Object)
		if err != nil {
			return last, synced, false
		}
		rev, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
		key := c.res.prefix + m.GetNamespace() + "/" + m.GetName()
		c.mu.Lock()
		switch {
		case !synced && ev.Type == watch.Bookmark && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true":
			// The watch-list's state is complete at rev.
			c.lists = append(c.lists, watchcheck.List{Who: c.name + " (watch-list)", Rev: rev, Items: initial})
			for k := range initial {
				c.seen[k] = true
			}
			synced, seg.From = true, rev
			c.segments = append(c.segments, seg)
		case !synced && ev.Type == watch.Added:
			initial[key] = rev
		case !synced:
		case ev.Type == watch.Bookmark:
			seg.Items = append(seg.Items, watchcheck.Item{Type: watch.Bookmark, Rev: rev})
		default:
			seg.Items = append(seg.Items, watchcheck.Item{Type: ev.Type, Key: key, Rev: rev})
			c.seen[key] = true
			events++
		}
		if synced {
			c.handed = append(c.handed, rev)
			last = rev
		}
		c.mu.Unlock()
		switch {
		case c.pause > 0:
			time.Sleep(c.pause) // a slow consumer's own work
		case c.pause < 0:
			goruntime.Gosched()
		}
		if synced && c.rewatchEvery > 0 && events >= c.rewatchEvery && !c.settled.Load() {
			seg.Cut = true
			return c.pickHanded(), true, false
		}
	}
}

func (c *rbClient) addSegment(seg *watchcheck.Segment) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.segments = append(c.segments, seg)
}

// pickHanded returns one of the resourceVersions the client was handed.
func (c *rbClient) pickHanded() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.handed[c.rnd.IntN(len(c.handed))]
}

// has reports whether the client received or listed key.
func (c *rbClient) has(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[key]
}

// rbLister lists a resource the ways clients do, in turn, until its
// context ends: consistently, at resourceVersion 0, and at exactly a
// resourceVersion a client was handed.
type rbLister struct {
	name  string
	res   *rbResource
	cache *rbCache
	// handed returns a resourceVersion some client was handed, 0 if none.
	handed func() int64
	acked  func() int64

	// mu guards lists and gone.
	mu    sync.Mutex
	lists []watchcheck.List
	gone  []rbGone
}

func (l *rbLister) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		opts := storage.ListOptions{Recursive: true, Predicate: storage.Everything}
		var minRev, exact int64
		switch i % 3 {
		case 0:
			minRev = l.acked()
		case 1:
			opts.ResourceVersion = "0"
		case 2:
			if exact = l.handed(); exact == 0 {
				continue
			}
			opts.ResourceVersion = strconv.FormatInt(exact, 10)
			opts.ResourceVersionMatch = metav1.ResourceVersionMatchExact
		}
		list := &example.PodList{}
		err := l.cache.get().GetList(ctx, l.res.prefix, opts, list)
		switch {
		case err == nil:
			rev, items := listItems(l.res.prefix, list)
			l.mu.Lock()
			l.lists = append(l.lists, watchcheck.List{Who: fmt.Sprintf("%s (%s)", l.name, opts.ResourceVersion), Rev: rev,
				Items: items, MinRev: minRev})
			l.mu.Unlock()
		case exact > 0 && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err)):
			l.mu.Lock()
			l.gone = append(l.gone, rbGone{rev: exact, at: time.Now(), msg: err.Error()})
			l.mu.Unlock()
		case errors.Is(err, context.Canceled):
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}
