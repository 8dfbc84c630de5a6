package faults

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// informer is a client-go shared informer over every assignment, from the
// generated clientset, that counts how often it synced: every list, and
// every watch with sendInitialEvents, after the first is a re-list.
type informer struct {
	name     string
	informer cache.SharedIndexInformer

	// mu guards syncs and failedAt.
	mu    sync.Mutex
	syncs int
	// failedAt is when a list or watch request of the informer last
	// failed; zero if none did.
	failedAt time.Time
}

// countingListWatch is the informer's ListWatch with counts of syncs.
type countingListWatch struct {
	*cache.ListWatch
	inf *informer
	// noWatchList makes the reflector list, whatever the WatchListClient gate says.
	noWatchList bool
}

// IsWatchListSemanticsUnSupported tells client-go's reflector not to use watch-list.
func (lw *countingListWatch) IsWatchListSemanticsUnSupported() bool { return lw.noWatchList }

// newInformer builds an informer; with watchList it syncs by watch-list
// (the WatchListClient gate must be on), without it by list.
func newInformer(name string, client versioned.Interface, watchList bool) *informer {
	inf := &informer{name: name}
	assignments := client.FleetV1beta1().Assignments("")
	lw := &countingListWatch{inf: inf, noWatchList: !watchList, ListWatch: &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			if opts.Continue == "" { // the pager's next page is the same list
				inf.countSync()
			}
			l, err := assignments.List(ctx, opts)
			inf.noteFailure(err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
				inf.countSync()
			}
			w, err := assignments.Watch(ctx, opts)
			inf.noteFailure(err)
			return w, err
		},
	}}
	inf.informer = cache.NewSharedIndexInformer(lw, &v1beta1.Assignment{}, 0, cache.Indexers{})
	return inf
}

func (i *informer) countSync() {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.syncs++
}

// noteFailure records a failed request, if err is one.
func (i *informer) noteFailure(err error) {
	if err == nil {
		return
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.failedAt = time.Now()
}

// lastFailure is when a request of the informer last failed; zero if none did.
func (i *informer) lastFailure() time.Time {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.failedAt
}

// relists is how many times the informer synced after its first sync.
func (i *informer) relists() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return max(i.syncs-1, 0)
}

// start runs the informer until ctx ends and waits for its first sync.
func (i *informer) start(ctx context.Context) bool {
	go i.informer.RunWithContext(ctx)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return cache.WaitForCacheSync(sctx.Done(), i.informer.HasSynced)
}

// items maps namespace/name to resourceVersion for everything the informer holds.
func (i *informer) items() map[string]int64 {
	m := map[string]int64{}
	for _, obj := range i.informer.GetStore().List() {
		a := obj.(*v1beta1.Assignment)
		m[a.Namespace+"/"+a.Name] = parseRV(a.ResourceVersion)
	}
	return m
}

// lastSynced is the resourceVersion the informer last saw.
func (i *informer) lastSynced() int64 { return parseRV(i.informer.LastSyncResourceVersion()) }
