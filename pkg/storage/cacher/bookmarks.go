package cacher

import (
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// bookmarkTick is how often due bookmarks go out.
const bookmarkTick = time.Second

// bookmarkBeforeDeadline is how long before a watch's deadline its last
// bookmark goes out, so that the client resumes from a fresh resourceVersion.
const bookmarkBeforeDeadline = 2 * time.Second

// nextBookmarkTime is when a watcher is next due a bookmark: one frequency
// from now, or shortly before its deadline if that comes first.
func nextBookmarkTime(now, deadline time.Time, frequency time.Duration) time.Time {
	next := now.Add(frequency)
	if deadline.IsZero() {
		return next
	}
	if beforeDeadline := deadline.Add(-bookmarkBeforeDeadline); beforeDeadline.Before(next) {
		if !beforeDeadline.After(now) {
			return time.Time{}
		}
		return beforeDeadline
	}
	return next
}

func (d *dispatcher) scheduleBookmarkLocked(w *watcher, now time.Time) {
	var deadline time.Time
	if w.deadline != 0 {
		deadline = time.Unix(0, w.deadline)
	}
	next := nextBookmarkTime(now, deadline, d.bookmarkFrequency)
	if next.IsZero() {
		return
	}
	sec := next.Unix()
	if sec <= d.lastBookmarkSecond {
		sec = d.lastBookmarkSecond + 1
	}
	d.bookmarks[sec] = append(d.bookmarks[sec], w)
}

// sendBookmarks offers a bookmark at the head to every synced watcher that
// is due one. A watcher whose channel is full, or that is catching up, is
// tried again a second later: it has events to read first.
func (d *dispatcher) sendBookmarks(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, head := d.log.bounds()
	// One bookmark object serves every watcher: it is never mutated.
	var bookmark runtime.Object
	for sec := d.lastBookmarkSecond + 1; sec <= now.Unix(); sec++ {
		due := d.bookmarks[sec]
		delete(d.bookmarks, sec)
		for _, w := range due {
			switch {
			case w.state == stopped:
				continue
			case w.state == synced && head >= w.cursor:
				if bookmark == nil {
					bookmark = d.bookmarkObject(head, false)
				}
				select {
				case w.ch <- watch.Event{Type: watch.Bookmark, Object: bookmark}:
					d.scheduleBookmarkLocked(w, now)
					continue
				default:
				}
			}
			d.bookmarks[sec+1] = append(d.bookmarks[sec+1], w)
		}
		d.lastBookmarkSecond = sec
	}
}

// beginShutdown sends a bookmark at the head to every synced watcher that
// accepts bookmarks, and makes register do the same for every watcher
// after; see Shutdown. A catching-up watcher is sending events already. It
// returns the watchers it sent a bookmark to.
func (d *dispatcher) beginShutdown() []*watcher {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.shuttingDown = true
	var sent []*watcher
	for _, w := range d.all {
		if d.bookmarkNowLocked(w) {
			sent = append(sent, w)
		}
	}
	for _, list := range d.byTrigger {
		for _, w := range list {
			if d.bookmarkNowLocked(w) {
				sent = append(sent, w)
			}
		}
	}
	return sent
}

// bookmarkNowLocked offers a synced watcher a bookmark at the head, if it
// accepts bookmarks and its channel has room, and reports whether it did.
// A watcher that resumed from a resourceVersion ahead of this cache (one
// another replica served it) gets a bookmark at its own resourceVersion:
// never an older one, and without one it would end with nothing delivered
// and make client-go re-list.
func (d *dispatcher) bookmarkNowLocked(w *watcher) bool {
	_, head := d.log.bounds()
	if !w.bookmarks || w.state != synced {
		return false
	}
	select {
	case w.ch <- watch.Event{Type: watch.Bookmark, Object: d.bookmarkObject(max(head, w.cursor), false)}:
		return true
	default:
		return false
	}
}
