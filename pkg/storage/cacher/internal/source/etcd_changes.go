package source

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage/etcd3/metrics"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// EtcdChangesConfig is what EtcdChanges reads and how.
type EtcdChangesConfig struct {
	EtcdReadConfig
	// Held, if set, returns the cache's object for key at rev, if the
	// cache holds that version: a put of it is not read again (Change.Held).
	Held func(key string, rev uint64) *object.Object
}

// EtcdChanges is Changes read straight from etcd's watch, with each value
// read as the etcd3 store reads it. It is what the etcd3 store's watch
// does for the cache, less what the cache does not need (filtering, and
// decoding the previous value of a put, since the cache holds it), and
// with a response's revisions kept whole. Each watch has a
// clientv3.Watcher of its own, and so a gRPC stream of its own, closed
// with it: a progress notification on it reports only this watch's
// progress, and a progress request after the watch ended cannot leave a
// stream behind, as one on a shared watcher can (issue 56).
type EtcdChanges struct {
	cfg    EtcdChangesConfig
	prefix etcdPrefix
	values etcdValues
}

var _ Changes = &EtcdChanges{}

// NewEtcdChanges returns Changes over cfg.
func NewEtcdChanges(cfg EtcdChangesConfig) *EtcdChanges {
	return &EtcdChanges{cfg: cfg, prefix: cfg.prefix(), values: cfg.values()}
}

// responseBuffer is how many responses a watch decodes ahead of the
// cache: enough to decode while the cache applies, as the etcd3 store's
// buffers of 100 events do, without holding much.
const responseBuffer = 16

// decodeChunk bounds the changes of one Response: etcd's response to a
// watch catching up on history holds up to 1,000 revisions, each of any
// size, and decoded at once, 100,000 objects written 128 to a revision
// held 212 MiB of decoded values at a warm start's peak. A Response still
// holds whole revisions, so it may hold more.
const decodeChunk = 1000

// Watch implements Changes. The watch requires a leader, as the etcd3
// store's: a member that loses its leader ends it.
//
// Unlike the etcd3 store's, it asks etcd to send a large response in
// fragments of its request limit (1.5 MiB by default), which etcd's client
// joins again into the one response etcd made: the same events, in whole
// revisions. Sent whole, a response catching up on history holds up to
// 1,000 revisions of any size, and gRPC's codec reads each into one buffer
// of its size, from gRPC's buffer pool: during a warm start's replay over a
// million objects written 128 to a revision, two such buffers of 230 MB
// were in use, besides the responses decoded from them
// (docs/benchmarks.md, "What s2 held at a million").
//
// It returns at once. etcd's client returns a watch only once etcd has
// answered that it created it, and a member that takes the stream and never
// answers would hold the cache's watch there for good, with no silence
// check, re-list or progress request handled meanwhile: the stream opens
// the watch on its own goroutine, and the follower's silence check ends a
// watch that etcd never created as any silent one.
func (c *EtcdChanges) Watch(ctx context.Context, rev uint64) ChangeStream {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	s := &etcdStream{c: c, ctx: ctx, cancel: cancel, w: clientv3.NewWatcher(c.cfg.Client),
		out: make(chan Response, responseBuffer), created: make(chan struct{}), done: make(chan struct{})}
	open := func() clientv3.WatchChan {
		if inject.Enabled && errors.Is(inject.Hit(ctx, inject.WatchOpen), inject.ErrStall) {
			<-ctx.Done()
		}
		return s.w.Watch(ctx, c.prefix.rangePrefix, clientv3.WithPrefix(), clientv3.WithRev(int64(rev)+1),
			clientv3.WithPrevKV(), clientv3.WithProgressNotify(), clientv3.WithFragment())
	}
	if inject.On(inject.WatchWaitsCreated) {
		wch := open()
		close(s.created)
		go s.run(func() clientv3.WatchChan { return wch })
		return s
	}
	go s.run(open)
	return s
}

// etcdStream is one watch of EtcdChanges.
type etcdStream struct {
	c      *EtcdChanges
	ctx    context.Context
	cancel context.CancelFunc
	w      clientv3.Watcher
	out    chan Response
	// created is closed once etcd created the watch; askedEarly is set by
	// a progress request made before, which run makes then.
	created    chan struct{}
	askedEarly atomic.Bool
	// done is closed when run has returned.
	done      chan struct{}
	closeOnce sync.Once
}

func (s *etcdStream) Responses() <-chan Response { return s.out }

func (s *etcdStream) RequestProgress(ctx context.Context) error {
	select {
	case <-s.created:
	default:
		// etcd would answer a request made before the watch exists to
		// no watch, and the answer would be lost: run makes it once the
		// watch exists, unless the watch came meanwhile and this call
		// takes it back.
		s.askedEarly.Store(true)
		select {
		case <-s.created:
		default:
			return nil
		}
		if !s.askedEarly.CompareAndSwap(true, false) {
			return nil // run made it
		}
	}
	// The watch's context names its stream; ctx bounds the wait.
	rctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	return s.w.RequestProgress(rctx)
}

func (s *etcdStream) Close() {
	s.closeOnce.Do(func() {
		s.cancel()
		<-s.done
		_ = s.w.Close()
	})
}

// run opens the watch, then turns etcd's responses into the stream's
// until the watch ends.
func (s *etcdStream) run(open func() clientv3.WatchChan) {
	defer close(s.done)
	defer close(s.out)
	wch := open()
	select {
	case <-s.created:
	default:
		close(s.created)
	}
	if s.askedEarly.CompareAndSwap(true, false) && s.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.RequestProgress(ctx)
		cancel()
	}
	for wres := range wch {
		var r Response
		switch {
		case wres.Err() != nil:
			end := classifyEtcd(wres.Err())
			r.End = &end
		case wres.IsProgressNotify():
			r.Progress = uint64(wres.Header.Revision)
		case len(wres.Events) == 0:
			continue // created, or a fragment's header
		default:
			if !s.sendChunks(wres.Events) {
				return
			}
			continue
		}
		if !s.send(r) {
			return
		}
	}
	end := End{Reason: EndClosed, Err: errors.New("the etcd watch closed")}
	if s.ctx.Err() != nil {
		end.Err = s.ctx.Err()
	}
	select {
	case s.out <- Response{End: &end}:
	case <-s.ctx.Done():
	}
}

// send hands r to the cache, and reports whether the stream goes on.
func (s *etcdStream) send(r Response) bool {
	select {
	case s.out <- r:
		return r.End == nil
	case <-s.ctx.Done():
		return false
	}
}

// sendChunks decodes events and hands them to the cache in Responses of
// whole revisions, each of at least decodeChunk changes but the last, so
// that no more than a chunk is decoded ahead of what the cache took.
func (s *etcdStream) sendChunks(events []*clientv3.Event) bool {
	for len(events) > 0 {
		n := min(decodeChunk, len(events))
		for n < len(events) && events[n].Kv.ModRevision == events[n-1].Kv.ModRevision {
			n++
		}
		if !s.send(s.decode(events[:n])) {
			return false
		}
		events = events[n:]
	}
	return true
}

// decode reads a response's events. A put that does not read or decode
// ends the watch, and the cache lists again: re-watching would meet it
// again. A deletion's last value that does not is left out, as etcd
// leaves it out once compacted, and the cache uses the one it holds. Each
// event counts in apiserver_storage_events_received_total, as the etcd3
// store's watch counts it.
func (s *etcdStream) decode(events []*clientv3.Event) Response {
	r := Response{Changes: make([]Change, 0, len(events))}
	for _, e := range events {
		metrics.RecordEtcdEvent(s.c.cfg.GroupResource)
		ch := Change{Key: s.c.prefix.cacheKey(e.Kv.Key), Rev: uint64(e.Kv.ModRevision), Deleted: e.Type == clientv3.EventTypeDelete}
		var err error
		switch {
		case !ch.Deleted && s.c.cfg.Held != nil && s.held(&ch):
		case !ch.Deleted:
			if ch.Object, err = s.read(e.Kv.Key, e.Kv.Value, ch.Rev); err != nil {
				end := End{Reason: EndUnreadable, Relist: true, Err: fmt.Errorf("reading %s at %d: %w", ch.Key, ch.Rev, err)}
				return Response{End: &end}
			}
		case e.PrevKv != nil:
			if ch.Object, err = s.read(e.Kv.Key, e.PrevKv.Value, ch.Rev); err != nil {
				klog.InfoS("Watch cache could not read a deleted object's last value; using the one it holds",
					"key", ch.Key, "resourceVersion", ch.Rev, "err", err)
			}
		}
		r.Changes = append(r.Changes, ch)
	}
	r.Decoded = time.Now()
	return r
}

// held sets ch.Held to the cache's object, if the cache holds the version
// ch puts, and reports whether it did: a warm start's backfill replays
// history whose puts the cache mostly holds already, and decoding them
// only to find so was most of its time and its transient memory.
func (s *etcdStream) held(ch *Change) bool {
	ch.Held = s.c.cfg.Held(ch.Key, ch.Rev)
	return ch.Held != nil
}

// read reads a stored value at rev, as the etcd3 store's watch does.
func (s *etcdStream) read(key, data []byte, rev uint64) (runtime.Object, error) {
	return s.c.values.read(s.ctx, key, data, rev)
}

// classifyEtcd decides what an error ending an etcd watch means.
func classifyEtcd(err error) End {
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return End{Reason: EndCompacted, Relist: true, Err: err}
	case errors.Is(err, rpctypes.ErrNoLeader):
		return End{Reason: EndNoLeader, Err: err}
	default:
		return End{Reason: EndUnavailable, Err: err}
	}
}
