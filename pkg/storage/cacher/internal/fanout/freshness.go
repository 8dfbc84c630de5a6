package fanout

import (
	"context"
	"time"

	"k8s.io/apiserver/pkg/storage"
)

// Readers that need the cache at least as fresh as a resourceVersion wait
// for the head to move (consistent reads, watches and lists from a
// resourceVersion ahead of the cache).

func (d *Dispatcher) notifyHeadLocked() {
	close(d.headCh)
	d.headCh = make(chan struct{})
}

// headChanged returns a channel closed when the head next moves.
func (d *Dispatcher) headChanged() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.headCh
}

// progressRetry is how often a waiting reader asks etcd for progress
// again. etcd drops a progress request for a watch it has not synced yet
// (progressIfSync in its watchable store) and syncs new watches every
// 100 ms: the request a reader makes as the cache's watch re-opens after
// an outage is lost, and the reader waits for the next. At 250 ms, ours
// recovered from a leader loss in 411 ms at the median of 4 runs
// (111–438), upstream's in about 150; at 100 ms, upstream's period too,
// in 204 ms (172–263) (TestFaults/leader_loss, docs/reliability.md).
const progressRetry = 100 * time.Millisecond

// WaitFor blocks until the head reaches rv, ctx ends or timeout passes.
// While it waits it asks etcd for a progress notification through
// requestProgress, since an idle resource's head moves only on those.
func (d *Dispatcher) WaitFor(ctx context.Context, rv uint64, timeout time.Duration, requestProgress func()) error {
	if _, head := d.log.Bounds(); head >= rv {
		return nil
	}
	start := d.clock.Now()
	defer func() { d.metrics.ReadWait.Observe(d.clock.Since(start).Seconds()) }()
	deadline := d.clock.NewTimer(timeout)
	defer deadline.Stop()
	retry := d.clock.NewTimer(0)
	defer retry.Stop()
	for {
		changed := d.headChanged()
		if _, head := d.log.Bounds(); head >= rv {
			return nil
		}
		select {
		case <-changed:
		case <-retry.C():
			if requestProgress != nil {
				requestProgress()
			}
			retry.Reset(progressRetry)
		case <-deadline.C():
			_, head := d.log.Bounds()
			return storage.NewTooLargeResourceVersionError(rv, head, 1)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
