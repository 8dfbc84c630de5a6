package testkit

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"time"
)

// WatchCallbacks are what ReadWatch calls: Event with each ADDED object's
// name and when its line was read, Bookmark for each bookmark, and Closed
// if the stream ends, or sends an ERROR, before ctx ends. Any may be nil.
type WatchCallbacks struct {
	Event    func(name string, at time.Time)
	Bookmark func()
	Closed   func()
}

// ReadWatch reads a JSON watch stream until it ends, and closes it. It
// decodes only each event's type and name, so that a benchmark's client
// stays cheap beside the server it measures.
func ReadWatch(ctx context.Context, body io.ReadCloser, cb WatchCallbacks) {
	defer body.Close()
	closed := func() {
		if cb.Closed != nil {
			cb.Closed()
		}
	}
	r := bufio.NewReaderSize(body, 2048)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			if ctx.Err() == nil {
				closed()
			}
			return
		}
		at := time.Now()
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if json.Unmarshal(line, &ev) != nil || ev.Type == "ERROR" {
			closed()
			return
		}
		switch {
		case ev.Type == "ADDED" && cb.Event != nil:
			cb.Event(ev.Object.Metadata.Name, at)
		case ev.Type == "BOOKMARK" && cb.Bookmark != nil:
			cb.Bookmark()
		}
	}
}
