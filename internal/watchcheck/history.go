// Package watchcheck checks what a watch cache hands out against etcd's
// own history: every watch stream for the guarantees etcd's robustness
// tests check of etcd's watch (tests/robustness/validate/watch.go in
// etcd-io/etcd), in Kubernetes' terms, and every list against etcd's state
// at its resourceVersion. The history is etcd's, read by a watch of its
// own from before the traffic: the ground truth, not expectations written
// by hand.
//
// It knows nothing of the objects but what a test decodes of them (O) and
// which of them a watcher selects (a match function), so that the cache's
// own tests over example pods and the HTTP fault harness over Assignments
// share it.
package watchcheck

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Change is one key's change in etcd.
type Change[O any] struct {
	Rev int64
	Key string
	// Prev is the value before the change, nil for a creation; Cur the
	// value after it, nil for a deletion.
	Prev, Cur *O
}

// Version is a key's value at the revision it was written at.
type Version[O any] struct {
	Rev int64
	Obj *O
}

// Decoder turns a value etcd holds under a key at a revision into what a
// test checks of it.
type Decoder[O any] func(key string, value []byte, rev int64) (*O, error)

// History is etcd's history of one prefix from a revision: the state then,
// and every change after it, from a watch with previous values, as etcd's
// robustness tests take it.
type History[O any] struct {
	// Start is the revision the history begins at; Initial the state then.
	Start   int64
	Initial map[string]Version[O]
	// key turns an etcd key into the key a test uses.
	key    func(etcdKey string) string
	decode Decoder[O]

	// mu guards changes, head and err.
	mu      sync.Mutex
	changes []Change[O]
	// head is the newest revision the watch reported, by an event or a
	// progress notification.
	head int64
	err  error
}

// Follow reads the state of prefix at etcd's current revision and watches
// every change after it until ctx ends. key turns etcd's keys into the
// test's; decode reads each value.
func Follow[O any](ctx context.Context, client *clientv3.Client, prefix string, key func(string) string, decode Decoder[O]) (*History[O], error) {
	resp, err := client.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	h := &History[O]{Start: resp.Header.Revision, head: resp.Header.Revision, Initial: map[string]Version[O]{}, key: key, decode: decode}
	for _, kv := range resp.Kvs {
		o, err := decode(key(string(kv.Key)), kv.Value, kv.ModRevision)
		if err != nil {
			return nil, err
		}
		h.Initial[key(string(kv.Key))] = Version[O]{Rev: kv.ModRevision, Obj: o}
	}
	wch := client.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(h.Start+1),
		clientv3.WithPrevKV(), clientv3.WithProgressNotify())
	go h.follow(ctx, wch)
	return h, nil
}

func (h *History[O]) follow(ctx context.Context, wch clientv3.WatchChan) {
	for resp := range wch {
		if err := resp.Err(); err != nil {
			h.fail(fmt.Errorf("the ground truth's etcd watch failed: %w", err))
			return
		}
		changes := make([]Change[O], 0, len(resp.Events))
		for _, e := range resp.Events {
			c := Change[O]{Rev: e.Kv.ModRevision, Key: h.key(string(e.Kv.Key))}
			var err error
			if e.PrevKv != nil {
				if c.Prev, err = h.decode(c.Key, e.PrevKv.Value, e.PrevKv.ModRevision); err != nil {
					h.fail(err)
					return
				}
			}
			if e.Type == clientv3.EventTypePut {
				if c.Cur, err = h.decode(c.Key, e.Kv.Value, e.Kv.ModRevision); err != nil {
					h.fail(err)
					return
				}
			}
			changes = append(changes, c)
		}
		h.mu.Lock()
		h.changes = append(h.changes, changes...)
		h.head = max(h.head, resp.Header.Revision)
		h.mu.Unlock()
	}
	if ctx.Err() == nil {
		h.fail(fmt.Errorf("the ground truth's etcd watch closed"))
	}
}

func (h *History[O]) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		h.err = err
	}
}

// WaitFor waits until the history has seen revision rev, asking etcd for
// progress so that a quiet prefix still gets there, for up to timeout.
func (h *History[O]) WaitFor(ctx context.Context, client *clientv3.Client, rev int64, timeout time.Duration) error {
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		h.mu.Lock()
		head, err := h.head, h.err
		h.mu.Unlock()
		if err != nil {
			return false, err
		}
		if head >= rev {
			return true, nil
		}
		_ = client.RequestProgress(ctx)
		return false, nil
	})
}

// Changes returns every change so far, in etcd's order, and the watch's
// error if it failed: then the history is incomplete.
func (h *History[O]) Changes() ([]Change[O], error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changes, h.err
}

// StateAt returns etcd's state at revision rev, which must not be before
// Start.
func (h *History[O]) StateAt(rev int64) map[string]Version[O] {
	changes, _ := h.Changes()
	state := make(map[string]Version[O], len(h.Initial))
	for k, v := range h.Initial {
		state[k] = v
	}
	for _, c := range changes {
		if c.Rev > rev {
			break
		}
		if c.Cur == nil {
			delete(state, c.Key)
		} else {
			state[c.Key] = Version[O]{Rev: c.Rev, Obj: c.Cur}
		}
	}
	return state
}

// Describe says what the history holds of key: its state at the start and
// its changes since, for a violation's reader.
func (h *History[O]) Describe(key string) string {
	changes, _ := h.Changes()
	out := fmt.Sprintf("%s: absent at %d", key, h.Start)
	if _, ok := h.Initial[key]; ok {
		out = fmt.Sprintf("%s: present at %d", key, h.Start)
	}
	for _, c := range changes {
		switch {
		case c.Key != key:
		case c.Cur == nil:
			out += fmt.Sprintf(", deleted at %d", c.Rev)
		default:
			out += fmt.Sprintf(", written at %d", c.Rev)
		}
	}
	return out
}
