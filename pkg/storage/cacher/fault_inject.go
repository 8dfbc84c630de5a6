//go:build faultinject

package cacher

import (
	"os"
	"sync"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
)

// faultEnv names the promise a faultinject build breaks in every watch:
// drop, duplicate or reorder one event, or send a bookmark before an event
// it claims to follow (early-bookmark).
const faultEnv = "CACHED_APISERVER_TEST_FAULT"

// faultyEvent is which event of a watch, bookmarks aside, the fault hits:
// late enough to be past a small initial state, early enough that every
// busy stream meets it.
const faultyEvent = 5

func init() {
	fault := os.Getenv(faultEnv)
	switch fault {
	case "":
		return
	case "drop", "duplicate", "reorder", "early-bookmark":
	default:
		klog.Fatalf("%s=%q: want drop, duplicate, reorder or early-bookmark", faultEnv, fault)
	}
	klog.Warningf("This build breaks the watch cache on purpose: %s=%s", faultEnv, fault)
	testFault = func(c *Cacher, w watch.Interface) watch.Interface {
		f := &injectedWatch{inner: w, fault: fault, c: c, ch: make(chan watch.Event), done: make(chan struct{})}
		go f.run()
		return f
	}
}

// injectedWatch passes a watch through, breaking it once.
type injectedWatch struct {
	inner watch.Interface
	fault string
	c     *Cacher
	ch    chan watch.Event
	done  chan struct{}
	once  sync.Once
}

func (f *injectedWatch) ResultChan() <-chan watch.Event { return f.ch }

func (f *injectedWatch) Stop() {
	f.once.Do(func() { close(f.done) })
	f.inner.Stop()
}

func (f *injectedWatch) send(ev watch.Event) bool {
	select {
	case f.ch <- ev:
		return true
	case <-f.done:
		return false
	}
}

func (f *injectedWatch) run() {
	defer close(f.ch)
	n := 0
	var held watch.Event
	for ev := range f.inner.ResultChan() {
		if ev.Type == watch.Bookmark || ev.Type == watch.Error {
			if !f.send(ev) {
				return
			}
			continue
		}
		n++
		out := []watch.Event{ev}
		switch {
		case n == faultyEvent && f.fault == "drop":
			out = nil
		case n == faultyEvent && f.fault == "duplicate":
			out = []watch.Event{ev, ev}
		case n == faultyEvent && f.fault == "reorder":
			held, out = ev, nil
		case n == faultyEvent+1 && f.fault == "reorder":
			out = []watch.Event{ev, held}
		case n == faultyEvent && f.fault == "early-bookmark":
			if rv, err := f.c.cfg.Versioner.ObjectResourceVersion(ev.Object); err == nil {
				out = []watch.Event{{Type: watch.Bookmark, Object: f.c.d.BookmarkObject(rv, false)}, ev}
			}
		}
		for _, e := range out {
			if !f.send(e) {
				return
			}
		}
	}
}
