//go:build faultinject

package cacher

import (
	"os"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
)

// faultyEvent is which event of a watch, bookmarks aside, the fault hits:
// late enough to be past a small initial state, early enough that every
// busy stream meets it.
const faultyEvent = 5

// The faults this file injects in every watch: drop, duplicate or reorder
// one event, or send a bookmark before an event it claims to follow
// (early-bookmark). internal/inject names the others, which their code
// injects where the bug would be.
var watchFaults = []string{"drop", "duplicate", "reorder", "early-bookmark"}

func init() {
	fault := os.Getenv(inject.Env)
	switch {
	case fault == "":
	case slices.Contains(inject.Known, inject.Fault(fault)):
		klog.Warningf("This build breaks the server on purpose: %s=%s", inject.Env, fault)
	case !slices.Contains(watchFaults, fault):
		klog.Fatalf("%s=%q: want one of %v or %v", inject.Env, fault, watchFaults, inject.Known)
	default:
		klog.Warningf("This build breaks the watch cache on purpose: %s=%s", inject.Env, fault)
	}
	// The fault is read at each watch, so that a test in this build can
	// change it (inject.Set).
	testFault = func(c *Cacher, w watch.Interface) watch.Interface {
		fault := string(inject.Current())
		if !slices.Contains(watchFaults, fault) {
			return w
		}
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
