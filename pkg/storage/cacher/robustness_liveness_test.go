package cacher

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// Liveness, checked beside the six guarantees once a run's faults are
// over (issue 65): every watch from a resourceVersion the cache handed out
// is served, or gets 410 only below its floor; nothing gets 429 for longer
// than the freshness timeout and 5 s; a list answers and the cache is
// ready; and ours' floor is the one a run without faults reaches. The
// probe retries every second, as a raw client would, not with client-go's
// backoff, which grows to 30 s.

const (
	// livenessGrace is how long after the faults end a request may still
	// be told to retry: the freshness timeout and 5 s.
	livenessGrace = DefaultFreshnessTimeout + 5*time.Second
	// livenessProbes bounds the resourceVersions probed per cache.
	livenessProbes = 8
	// livenessRetry is how often the probe tries again.
	livenessRetry = time.Second
	// firstEventWait bounds the wait for a served watch's first event:
	// every probed resourceVersion is before the run's last write.
	firstEventWait = 5 * time.Second
)

// handedTo returns the resourceVersions clients of r were handed, sorted
// and without repeats.
func handedTo(clients []*rbClient, r *rbResource) []int64 {
	var out []int64
	for _, c := range clients {
		if c.res != r {
			continue
		}
		c.mu.Lock()
		out = append(out, c.handed...)
		c.mu.Unlock()
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// probeLiveness checks c's liveness: faults ended at healthy.
func probeLiveness(ctx context.Context, r *rbResource, c *rbCache, handed []int64, w *rbWriter, healthy time.Time) watchcheck.Violations {
	var v watchcheck.Violations
	name := c.impl + "/" + r.name
	deadline := healthy.Add(livenessGrace)
	changes, err := r.truth.Changes()
	if err != nil {
		v.Note(&v.Liveness, "%s: the ground truth is incomplete: %v", name, err)
		return v
	}
	if len(changes) == 0 {
		return v
	}
	last := changes[len(changes)-1].Rev
	// Every probe has an event after it: the run's last write.
	var probes []int64
	for _, rv := range handed {
		if rv > 0 && rv < last {
			probes = append(probes, rv)
		}
	}
	if len(probes) > livenessProbes {
		rnd := rand.New(rand.NewPCG(uint64(len(probes)), uint64(last)))
		picked := []int64{probes[0], probes[len(probes)-1]}
		for len(picked) < livenessProbes {
			picked = append(picked, probes[rnd.IntN(len(probes))])
		}
		probes = picked
	}
	if !retryUntil(ctx, deadline, func() bool { return c.get().ReadinessCheck() == nil }) {
		v.Note(&v.Liveness, "%s: not ready %v after its faults ended", name, livenessGrace)
	}
	if !retryUntil(ctx, deadline, func() bool {
		return c.get().GetList(ctx, r.prefix, storage.ListOptions{Recursive: true, Predicate: storage.Everything}, &example.PodList{}) == nil
	}) {
		v.Note(&v.Liveness, "%s: no consistent list answered %v after its faults ended", name, livenessGrace)
	}
	for _, rv := range probes {
		probeWatch(ctx, &v, name, r, c, w, changes, rv, deadline)
		if v.Liveness > 0 {
			break // one says enough; a stuck cache makes each probe wait out its deadline
		}
	}
	if cc, ok := c.get().(*Cacher); ok && !c.lostHistorySince(0) {
		if floor, want := int64(cc.Floor()), max(w.compactedBefore(time.Now()), 1); floor > want {
			v.Note(&v.Liveness, "%s: floor %d after its faults, above etcd's compaction at %d, which a run without faults keeps",
				name, floor, want)
		}
	}
	return v
}

// probeWatch watches from rv every second until the watch is served,
// answered 410, or deadline passes with only 429s and errors, and checks
// the answer.
func probeWatch(ctx context.Context, v *watchcheck.Violations, name string, r *rbResource, c *rbCache, w *rbWriter,
	changes []watchcheck.Change[rbPod], rv int64, deadline time.Time) {
	want := watchcheck.Expected(changes, func(*rbPod) bool { return true }, rv, changes[len(changes)-1].Rev)[0]
	var lastErr error
	for {
		got, err := firstEvent(ctx, c.get(), r.prefix, rv)
		switch {
		case err == nil && got != want:
			v.Note(&v.Resumable, "%s: a watch from %d began with %+v, want %+v", name, rv, got, want)
			return
		case err == nil:
			return
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			compacted := w.compactedBefore(time.Now())
			if rv < compacted || c.lostHistorySince(rv) {
				return
			}
			v.Note(&v.Liveness, "%s: 410 for a watch from %d, above its floor (etcd compacted at %d): %v", name, rv, compacted, err)
			return
		}
		lastErr = err
		if !time.Now().Before(deadline) {
			v.Note(&v.Liveness, "%s: a watch from %d not served %v after the faults ended: %v", name, rv, livenessGrace, lastErr)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(livenessRetry):
		}
	}
}

// firstEvent watches s from rv and returns its first event, bookmarks
// aside, or the error the watch was answered with.
func firstEvent(ctx context.Context, s storage.Interface, prefix string, rv int64) (watchcheck.Item, error) {
	ctx, cancel := context.WithTimeout(ctx, firstEventWait)
	defer cancel()
	wi, err := s.Watch(ctx, prefix, storage.ListOptions{ResourceVersion: strconv.FormatInt(rv, 10), Recursive: true,
		Predicate: storage.Everything})
	if err != nil {
		return watchcheck.Item{}, err
	}
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return watchcheck.Item{}, ctx.Err()
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return watchcheck.Item{}, context.Canceled
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			if ev.Type == watch.Error {
				return watchcheck.Item{}, apierrors.FromObject(ev.Object)
			}
			m, err := meta.Accessor(ev.Object)
			if err != nil {
				return watchcheck.Item{}, err
			}
			rev, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
			return watchcheck.Item{Type: ev.Type, Key: prefix + m.GetNamespace() + "/" + m.GetName(), Rev: rev}, nil
		}
	}
}

// retryUntil calls ok every livenessRetry until it holds or deadline
// passes; it is called at least once.
func retryUntil(ctx context.Context, deadline time.Time, ok func() bool) bool {
	return wait.PollUntilContextTimeout(ctx, livenessRetry, time.Until(deadline), true,
		func(context.Context) (bool, error) { return ok(), nil }) == nil
}
