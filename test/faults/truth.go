package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// etcdPrefix is where the servers keep assignments in etcd.
const etcdPrefix = "/registry/fleet.example.com/assignments/"

// objState is what the invariants need of one version of an assignment.
type objState struct {
	key, namespace, name string
	rv                   int64
	labels               map[string]string
	agent, phase         string
}

// truthEvent is one change in etcd.
type truthEvent struct {
	rv        int64
	key       string
	prev, cur *objState // cur is nil for a deletion
}

// truth is the ground truth: etcd's own history of the resource, from a
// direct watch with previous values, as etcd's robustness tests take it.
// Every stream and list the servers hand out is checked against it.
type truth struct {
	start   int64
	initial map[string]*objState

	// mu guards the fields below.
	mu     sync.Mutex
	events []truthEvent
	// head is the newest revision the watch has reported, by an event or a
	// progress notification.
	head int64
	err  error
}

// startTruth reads the state at the current revision and watches every
// change after it until ctx ends.
func startTruth(ctx context.Context, client *clientv3.Client) (*truth, error) {
	resp, err := client.Get(ctx, etcdPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	t := &truth{start: resp.Header.Revision, head: resp.Header.Revision, initial: map[string]*objState{}}
	for _, kv := range resp.Kvs {
		o, err := decodeState(kv.Key, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, err
		}
		t.initial[o.key] = o
	}
	wch := client.Watch(ctx, etcdPrefix, clientv3.WithPrefix(), clientv3.WithRev(t.start+1),
		clientv3.WithPrevKV(), clientv3.WithProgressNotify())
	go t.follow(ctx, wch)
	return t, nil
}

func (t *truth) follow(ctx context.Context, wch clientv3.WatchChan) {
	for resp := range wch {
		if err := resp.Err(); err != nil {
			t.fail(fmt.Errorf("the ground truth's etcd watch failed: %w", err))
			return
		}
		var evs []truthEvent
		for _, e := range resp.Events {
			te := truthEvent{rv: e.Kv.ModRevision, key: string(e.Kv.Key)}
			var err error
			if e.PrevKv != nil {
				if te.prev, err = decodeState(e.PrevKv.Key, e.PrevKv.Value, e.PrevKv.ModRevision); err != nil {
					t.fail(err)
					return
				}
			}
			if e.Type == clientv3.EventTypePut {
				if te.cur, err = decodeState(e.Kv.Key, e.Kv.Value, e.Kv.ModRevision); err != nil {
					t.fail(err)
					return
				}
			}
			te.key = keyOf(string(e.Kv.Key))
			evs = append(evs, te)
		}
		t.mu.Lock()
		t.events = append(t.events, evs...)
		t.head = max(t.head, resp.Header.Revision)
		t.mu.Unlock()
	}
	if ctx.Err() == nil {
		t.fail(fmt.Errorf("the ground truth's etcd watch closed"))
	}
}

func (t *truth) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil {
		t.err = err
	}
}

// keyOf turns an etcd key into the namespace/name key the harness uses.
func keyOf(etcdKey string) string { return strings.TrimPrefix(etcdKey, etcdPrefix) }

func decodeState(key, value []byte, rev int64) (*objState, error) {
	var a v1beta1.Assignment
	if err := json.Unmarshal(value, &a); err != nil {
		return nil, fmt.Errorf("decoding %s at %d: %w", key, rev, err)
	}
	return &objState{key: keyOf(string(key)), namespace: a.Namespace, name: a.Name, rv: rev, labels: a.Labels,
		agent: a.Spec.AgentName, phase: string(a.Status.Phase)}, nil
}

// waitFor waits until the truth has seen revision rev, asking etcd for
// progress so that a quiet resource still gets there.
func (t *truth) waitFor(ctx context.Context, client *clientv3.Client, rev int64) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		t.mu.Lock()
		head, err := t.head, t.err
		t.mu.Unlock()
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

// history returns every event so far, in revision order.
func (t *truth) history() ([]truthEvent, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.events, t.err
}

// stateAt returns the objects at revision rev.
func (t *truth) stateAt(rev int64) map[string]*objState {
	state := make(map[string]*objState, len(t.initial))
	for k, o := range t.initial {
		state[k] = o
	}
	events, _ := t.history()
	for _, e := range events {
		if e.rv > rev {
			break
		}
		if e.cur == nil {
			delete(state, e.key)
		} else {
			state[e.key] = e.cur
		}
	}
	return state
}
