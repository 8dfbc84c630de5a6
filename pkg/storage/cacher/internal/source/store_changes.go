//go:build storechanges

package source

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
)

// This file is the other way issue 56 named to find where a revision ends,
// kept only for the same-run A/B that chose between them (docs/benchmarks.md,
// "Whole revisions"): a build with the storechanges tag follows the etcd3
// store's Watch, which hands out one event at a time, instead of etcd's own
// watch. A revision is complete once an event of the next one or a progress
// notification at or past it arrives; after each event that finds nothing
// more queued, the stream asks etcd for progress, so that the last revision
// of a burst completes without waiting for the next write.

// WatchStore is what StoreChanges needs of the etcd3 store.
type WatchStore interface {
	Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error)
	RequestWatchProgress(ctx context.Context) error
}

// StoreChanges is Changes over the etcd3 store's Watch.
type StoreChanges struct {
	Store     WatchStore
	Prefix    string
	KeyFunc   func(runtime.Object) (string, error)
	Versioner storage.Versioner
	// streams names each watch's gRPC stream: etcd's client shares one
	// between watches whose contexts carry the same metadata.
	streams atomic.Uint64
}

// Watch implements Changes.
func (c *StoreChanges) Watch(ctx context.Context, rev uint64) ChangeStream {
	ctx = metadata.AppendToOutgoingContext(ctx, "cached-apiserver-watch", fmt.Sprint(c.streams.Add(1)))
	ctx, cancel := context.WithCancel(ctx)
	s := &storeStream{c: c, ctx: ctx, cancel: cancel, out: make(chan Response, responseBuffer), done: make(chan struct{})}
	w, err := c.Store.Watch(ctx, c.Prefix, storage.ListOptions{ResourceVersion: fmt.Sprint(rev), Recursive: true, ProgressNotify: true,
		Predicate: storage.SelectionPredicate{Label: labels.Everything(), Field: fields.Everything(), AllowWatchBookmarks: true}})
	go s.run(w, err)
	return s
}

type storeStream struct {
	c      *StoreChanges
	ctx    context.Context
	cancel context.CancelFunc
	out    chan Response
	done   chan struct{}
	once   sync.Once
}

func (s *storeStream) Responses() <-chan Response { return s.out }

func (s *storeStream) RequestProgress(ctx context.Context) error {
	rctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	return s.c.Store.RequestWatchProgress(rctx)
}

func (s *storeStream) Close() {
	s.once.Do(func() {
		s.cancel()
		<-s.done
	})
}

func (s *storeStream) send(r Response) bool {
	select {
	case s.out <- r:
		return true
	case <-s.ctx.Done():
		return false
	}
}

func (s *storeStream) run(w watch.Interface, err error) {
	defer close(s.done)
	defer close(s.out)
	if err != nil {
		end := End{Reason: EndUnavailable, Err: err}
		s.send(Response{End: &end})
		return
	}
	defer w.Stop()
	var pending []Change
	flush := func() bool {
		if len(pending) == 0 {
			return true
		}
		r := Response{Changes: pending, Decoded: time.Now()}
		pending = nil
		return s.send(r)
	}
	for ev := range w.ResultChan() {
		if timed, ok := ev.Object.(storage.WatchEventWithRecordTime); ok {
			ev.Object = timed.Unwrap()
		}
		switch ev.Type {
		case watch.Bookmark:
			rv, err := s.c.Versioner.ObjectResourceVersion(ev.Object)
			if err != nil {
				continue
			}
			if len(pending) > 0 && rv >= pending[0].Rev && !flush() {
				return
			}
			if !s.send(Response{Progress: rv}) {
				return
			}
		case watch.Error:
			end := End{Reason: EndUnavailable, Err: apierrors.FromObject(ev.Object)}
			if status := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(status) || apierrors.IsGone(status) {
				end = End{Reason: EndCompacted, Relist: true, Err: status}
			}
			s.send(Response{End: &end})
			return
		default:
			rv, err := s.c.Versioner.ObjectResourceVersion(ev.Object)
			key, kerr := s.c.KeyFunc(ev.Object)
			if err != nil || kerr != nil {
				end := End{Reason: EndUnreadable, Relist: true, Err: fmt.Errorf("%v %v", err, kerr)}
				s.send(Response{End: &end})
				return
			}
			if len(pending) > 0 && pending[0].Rev != rv && !flush() {
				return
			}
			pending = append(pending, Change{Key: key, Rev: rv, Deleted: ev.Type == watch.Deleted, Object: ev.Object})
			if len(w.ResultChan()) == 0 {
				// Nothing more queued: ask etcd whether the revision is
				// complete.
				_ = s.RequestProgress(context.Background())
			}
		}
	}
	end := End{Reason: EndClosed, Err: fmt.Errorf("the etcd3 store's watch closed")}
	s.send(Response{End: &end})
}
