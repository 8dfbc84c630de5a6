package gate

import "k8s.io/apimachinery/pkg/watch"

// Stream is the watcher a turn sends to.
type Stream struct {
	// Events is the watcher's channel.
	Events chan<- watch.Event
	// Done is closed when the watcher stops.
	Done <-chan struct{}
}

// send delivers ev, or reports false once the watcher stopped.
func (s Stream) send(ev watch.Event) bool {
	select {
	case <-s.Done:
		return false
	default:
	}
	select {
	case s.Events <- ev:
		return true
	case <-s.Done:
		return false
	}
}
