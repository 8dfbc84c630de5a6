package cacher

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
)

// consumers read the benchmarks' watches, each until the run ends, and
// tell when every one has had the events it expects. A watch that expects
// none stays open too, so that runs measure the watchers an event does
// not concern as well.
type consumers struct {
	// satisfied counts consumers short of their events, exited their goroutines.
	satisfied, exited sync.WaitGroup
	// finished ends every consumer.
	finished chan struct{}
	// closed counts watches that ended, or sent an error, before the run did.
	closed atomic.Int64
}

func newConsumers() *consumers { return &consumers{finished: make(chan struct{})} }

// consume reads w in a goroutine, calling onEvent with every event but
// bookmarks, until the run finishes or w ends; it counts w satisfied once
// expected events have come.
func (c *consumers) consume(b *testing.B, w watch.Interface, expected int, onEvent func(watch.Event)) {
	c.satisfied.Add(1)
	c.exited.Add(1)
	go func() {
		defer c.exited.Done()
		defer w.Stop()
		var once sync.Once
		done := func() { once.Do(c.satisfied.Done) }
		defer done()
		if expected == 0 {
			done()
		}
		got := 0
		for {
			var ev watch.Event
			var ok bool
			select {
			case <-c.finished:
				return
			case ev, ok = <-w.ResultChan():
			}
			if !ok || ev.Type == watch.Error {
				if c.closed.Add(1) == 1 && ok {
					b.Logf("first watcher ended early with %v", ev.Object)
				}
				return
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			onEvent(ev)
			if got++; got == expected {
				done()
			}
		}
	}()
}

// finish waits until every consumer had its events, or timeout passes,
// then ends them all.
func (c *consumers) finish(timeout time.Duration) {
	all := make(chan struct{})
	go func() { c.satisfied.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(timeout): // bounded: what has not arrived by now is not delivered
	}
	close(c.finished)
	c.exited.Wait()
}
