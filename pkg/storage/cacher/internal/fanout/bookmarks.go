package fanout

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/history"
)

// BookmarkTick is how often due bookmarks go out.
const BookmarkTick = time.Second

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

func (d *Dispatcher) scheduleBookmarkLocked(w *Watcher, now time.Time) {
	var deadline time.Time
	if w.Deadline != 0 {
		deadline = time.Unix(0, w.Deadline)
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

// SendBookmarks offers a bookmark at the head to every synced watcher that
// is due one and does not hold the head already. A watcher whose channel
// is full, or that is catching up, is tried again a second later: it has
// events to read first.
//
// A watcher that holds the head, because it was sent an event or a
// bookmark at it, or watched from it, is not sent a periodic one: its
// client would learn nothing. So an idle resource's watchers cost nothing
// each minute once they have the head, as upstream's, which sends only
// bookmarks past the resourceVersion a watch started from. The bookmark
// before the watch's deadline always goes, once: clients, and upstream's
// conformance, take it as the sign of a watch that ends on time.
func (d *Dispatcher) SendBookmarks(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, head := d.log.Bounds()
	for sec := d.lastBookmarkSecond + 1; sec <= now.Unix(); sec++ {
		due := d.bookmarks[sec]
		delete(d.bookmarks, sec)
		for _, w := range due {
			switch {
			case w.state == stopped:
				continue
			case w.state == synced && head <= w.sent && !w.endsBy(now.Add(BookmarkTick+bookmarkBeforeDeadline)):
				d.scheduleBookmarkLocked(w, now)
				continue
			case w.state == synced && head >= w.pos.RV:
				select {
				case w.ch <- watch.Event{Type: watch.Bookmark, Object: d.sharedBookmarkLocked(head)}:
					w.sent = head
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

// sharedBookmarkLocked returns a bookmark at rv that every watcher sent one
// at rv shares, with its encodings: each client is sent the bytes encoded
// for the first. Upstream copies and encodes a bookmark for each watcher:
// with 20,000 watchers, 20,000 encodings a minute while writes go on.
func (d *Dispatcher) sharedBookmarkLocked(rv uint64) runtime.Object {
	if d.bookmark == nil || d.bookmarkRV != rv {
		d.bookmark, d.bookmarkRV = d.pres.shared(d.BookmarkObject(rv, false), rv), rv
	}
	return d.bookmark
}

// beginShutdown sends a bookmark at the head to every synced watcher that
// accepts bookmarks, and makes register do the same for every watcher
// after; see Shutdown. A synced watcher whose channel is full is parked: its
// catch-up waits for room, which the dispatcher's lock cannot. A
// catching-up watcher gets its bookmark from its catch-up, once it reaches
// the head (owesShutdownBookmark). It returns every watcher owed a
// bookmark, for Begin to wait on.
func (d *Dispatcher) beginShutdown() []*Watcher {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.shuttingDown = true
	var owed, full []*Watcher
	for w := range d.lagging {
		if w.bookmarks {
			owed = append(owed, w)
		}
	}
	d.synced.each(func(w *Watcher) {
		if !w.bookmarks {
			return
		}
		owed = append(owed, w)
		if !d.bookmarkNowLocked(w) {
			full = append(full, w)
		}
	})
	// A synced watcher has had everything up to the head.
	_, head := d.log.Bounds()
	for _, w := range full {
		d.parkLocked(w, history.At(head))
	}
	return owed
}

// owesShutdownBookmark reports whether w, caught up by its catch-up
// goroutine, must be sent its shutdown bookmark before it syncs.
func (d *Dispatcher) owesShutdownBookmark(w *Watcher) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.shuttingDown && w.bookmarks && !w.shutdownBookmarked.Load()
}

// bookmarkNowLocked offers a synced watcher a bookmark at the head, if it
// accepts bookmarks and its channel has room, and reports whether it did.
// A watcher that resumed from a resourceVersion ahead of this cache (one
// another replica served it) gets a bookmark at its own resourceVersion:
// never an older one, and without one it would end with nothing delivered
// and make client-go re-list.
func (d *Dispatcher) bookmarkNowLocked(w *Watcher) bool {
	_, head := d.log.Bounds()
	if !w.bookmarks || w.state != synced {
		return false
	}
	rv := max(head, w.pos.RV)
	select {
	case w.ch <- watch.Event{Type: watch.Bookmark, Object: d.sharedBookmarkLocked(rv)}:
		w.sent = rv
		w.shutdownBookmarked.Store(true)
		return true
	default:
		return false
	}
}

// BookmarkObject is an empty object carrying a resourceVersion.
func (d *Dispatcher) BookmarkObject(rv uint64, initialEventsEnd bool) runtime.Object {
	obj := d.newFunc()
	if err := d.versioner.UpdateObject(obj, rv); err != nil {
		// newFunc returns objects with metadata; say so if one does not.
		klog.ErrorS(err, "Cannot set the resourceVersion of a bookmark")
	}
	if initialEventsEnd {
		if m, ok := obj.(metav1.Object); ok {
			m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		}
	}
	return obj
}
