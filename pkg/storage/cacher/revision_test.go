package cacher

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// The two reproductions of issue 56 that made several events in one etcd
// revision a thing the cache must get right: objects whose leases expire a
// dozen at a time, and transactions deleting a dozen keys. Each runs 30
// watchers on everything against our cache and upstream's over the same
// etcd, some reading at full speed and the others spending 0.4–2 ms on each
// event, and checks every stream against etcd's own history. Ours must
// deliver every event to every watcher; what upstream's does is logged.

// revisionWatchers is how many watchers each cache gets.
const revisionWatchers = 30

// revisionStream is one watcher's stream, recorded.
type revisionStream struct {
	impl, name string
	pause      time.Duration

	// mu guards seg and ended.
	mu    sync.Mutex
	seg   watchcheck.Segment
	ended string
}

// watchEverything opens revisionWatchers watchers from rev on each of
// env's caches of its busy resource, and reads them until the test ends.
func watchEverything(t *testing.T, env *rbEnv, rev int64) []*revisionStream {
	t.Helper()
	r := env.resources[0]
	var streams []*revisionStream
	for _, impl := range rbImpls {
		for i := range revisionWatchers {
			s := &revisionStream{impl: impl, name: fmt.Sprintf("%s/%d", impl, i), seg: watchcheck.Segment{From: rev}}
			if i%2 == 1 {
				s.pause = time.Duration(400+1600*i/revisionWatchers) * time.Microsecond
			}
			w, err := r.caches[impl].get().Watch(context.Background(), r.prefix, storage.ListOptions{
				ResourceVersion: strconv.FormatInt(rev, 10), Recursive: true, Predicate: rbSelectors[0].pred})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Stop)
			go s.read(r.prefix, w)
			streams = append(streams, s)
		}
	}
	return streams
}

func (s *revisionStream) read(prefix string, w watch.Interface) {
	for ev := range w.ResultChan() {
		m, err := meta.Accessor(ev.Object)
		if ev.Type == watch.Error || err != nil {
			s.mu.Lock()
			s.ended = fmt.Sprintf("%s %v", ev.Type, ev.Object)
			s.mu.Unlock()
			return
		}
		rev, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
		s.mu.Lock()
		s.seg.Items = append(s.seg.Items, watchcheck.Item{Type: ev.Type, Key: prefix + m.GetNamespace() + "/" + m.GetName(), Rev: rev})
		s.mu.Unlock()
		if s.pause > 0 {
			time.Sleep(s.pause) // the consumer's own work
		}
	}
	s.mu.Lock()
	if s.ended == "" {
		s.ended = "closed"
	}
	s.mu.Unlock()
}

// events returns how many events the stream received, and how it ended.
func (s *revisionStream) events() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seg.Items), s.ended
}

// checkRevisionStreams waits until every stream has received want events
// or ended, then checks each against etcd's history: ours must have every
// event, once and in order; upstream's is reported.
func checkRevisionStreams(t *testing.T, env *rbEnv, streams []*revisionStream, want int) {
	t.Helper()
	_ = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, s := range streams {
			if n, ended := s.events(); n < want && ended == "" {
				return false, nil
			}
		}
		return true, nil
	})
	changes, err := env.resources[0].truth.Changes()
	if err != nil {
		t.Fatal(err)
	}
	complete := map[string]int{}
	for _, s := range streams {
		n, ended := s.events()
		s.mu.Lock()
		v := watchcheck.CheckSegment(s.name, changes, rbSelectors[0].match, s.seg)
		s.mu.Unlock()
		if n == want && v.Total() == 0 {
			complete[s.impl]++
		}
		if s.impl != rbOurs {
			continue
		}
		if n != want || v.Total() > 0 || ended != "" {
			t.Errorf("%s: %d of %d events, ended %q: %v %v", s.name, n, want, ended, v, v.Details)
		}
	}
	for _, impl := range rbImpls {
		t.Logf("%s: %d of %d watchers got all %d events", impl, complete[impl], revisionWatchers, want)
	}
}

// TestLeaseExpiriesReachEveryWatcher creates objects with a TTL through the
// etcd3 store, a dozen at a time so that each dozen shares a lease, and lets
// 8 leases expire: each expiry deletes a dozen objects in one revision.
// Before issue 56's fix, not one of 30 watchers of ours got every event:
// each missed one deletion of every expiry, whatever its speed.
func TestLeaseExpiriesReachEveryWatcher(t *testing.T) {
	const leases, perLease = 8, 12
	// A TTL of 20 s is the shortest the etcd3 store's lease manager shares
	// a lease for (it reuses one for 5% of the TTL, in whole seconds).
	const ttl = 20
	env := newRBEnv(t, nil)
	ctx := context.Background()
	env.followTruth(ctx, t)
	env.waitReady(t)
	r := env.resources[0]
	store := env.newStore(t, r, rbCodec, etcd3.LeaseManagerConfig{ReuseDurationSeconds: 60, MaxObjectCount: perLease})
	start := rbHead(t, env)
	streams := watchEverything(t, env, start)
	for i := range leases * perLease {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("ttl-%03d", i)}}
		if err := store.Create(ctx, r.prefix+"ns/"+pod.Name, pod, &example.Pod{}, ttl); err != nil {
			t.Fatal(err)
		}
	}
	checkRevisionStreams(t, env, streams, 2*leases*perLease)
	// The expiries were whole revisions of a dozen deletions each.
	changes, _ := r.truth.Changes()
	revisions := map[int64]int{}
	for _, c := range changes {
		if c.Cur == nil {
			revisions[c.Rev]++
		}
	}
	if len(revisions) != leases {
		t.Errorf("the deletions came in %d revisions, want %d: the objects did not share %d leases", len(revisions), leases, leases)
	}
}

// TestTransactionsReachEveryWatcher writes 20 rounds of 12 creates through
// the etcd3 store, each followed by one transaction, straight to etcd,
// deleting the 12. Before issue 56's fix, 0 to 11 of 30 watchers of ours
// got every event; one at full speed got 461 of 480.
func TestTransactionsReachEveryWatcher(t *testing.T) {
	const rounds, perRound = 20, 12
	env := newRBEnv(t, nil)
	ctx := context.Background()
	env.followTruth(ctx, t)
	env.waitReady(t)
	r := env.resources[0]
	streams := watchEverything(t, env, rbHead(t, env))
	for round := range rounds {
		var deletes []clientv3.Op
		for i := range perRound {
			pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("txn-%02d-%02d", round, i)}}
			if err := r.store.Create(ctx, r.prefix+"ns/"+pod.Name, pod, &example.Pod{}, 0); err != nil {
				t.Fatal(err)
			}
			deletes = append(deletes, clientv3.OpDelete(r.etcdPrefix+"ns/"+pod.Name))
		}
		if _, err := env.client.Txn(ctx).Then(deletes...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	checkRevisionStreams(t, env, streams, 2*rounds*perRound)
}

// rbHead returns etcd's current revision.
func rbHead(t *testing.T, env *rbEnv) int64 {
	t.Helper()
	resp, err := env.client.Get(context.Background(), "revision-probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}
