package faults

import (
	"context"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
	fleetscheme "github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned/scheme"
)

// listResult is one list a client got, to be compared with the truth at
// its resourceVersion.
type listResult struct {
	who   string
	sel   selector
	rv    int64
	items map[string]int64
	// consistent lists must be at least as fresh as minRV, the newest
	// write acknowledged before they started.
	consistent bool
	minRV      int64
}

// listLog collects every list and list error of a run.
type listLog struct {
	// mu guards the fields below.
	mu     sync.Mutex
	lists  []listResult
	errors map[string]int
	// firstErr is the first error of each kind, for the notes.
	firstErr map[string]string
}

func newListLog() *listLog { return &listLog{errors: map[string]int{}, firstErr: map[string]string{}} }

func (l *listLog) add(r listResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lists = append(l.lists, r)
}

func (l *listLog) fail(what string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	code := "other"
	if s, ok := err.(apierrors.APIStatus); ok {
		code = strconv.Itoa(int(s.Status().Code))
	}
	key := what + " " + code
	if l.errors[key] == 0 {
		l.firstErr[key] = err.Error()
	}
	l.errors[key]++
}

// lister lists all assignments in the three ways clients do, in turn,
// until ctx ends: consistent, at resourceVersion 0, and in pages of 25
// following continue tokens; and, every fourth, all agents. Failures while a fault is on are expected; a
// list that succeeds must equal the truth.
func lister(ctx context.Context, client versioned.Interface, log *listLog, acked func() int64) {
	assignments := noRetries{client.FleetV1beta1().RESTClient()}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lists := failures{log, ctx}
		switch i % 4 {
		case 3:
			// The idle resource, read consistently: its cache hears only
			// progress notifications while the other is written.
			minRV := acked()
			out := &v1beta1.AgentList{}
			if err := assignments.Get().Resource("agents").MaxRetries(0).Do(rctx).Into(out); err != nil {
				lists.fail("consistent list of agents", err)
			} else {
				items := map[string]int64{}
				for _, a := range out.Items {
					items[a.Name] = parseRV(a.ResourceVersion)
				}
				lists.add(listResult{who: "lister (agents)", sel: selector{resource: agentsRes}, rv: parseRV(out.ResourceVersion),
					items: items, consistent: true, minRV: minRV})
			}
		case 0:
			minRV := acked()
			if l, err := assignments.List(rctx, metav1.ListOptions{}); err != nil {
				lists.fail("consistent list", err)
			} else {
				lists.add(listResult{who: "lister (consistent)", rv: parseRV(l.ResourceVersion), items: itemsOf(l.Items), consistent: true, minRV: minRV})
			}
		case 1:
			if l, err := assignments.List(rctx, metav1.ListOptions{ResourceVersion: "0"}); err != nil {
				lists.fail("list at 0", err)
			} else {
				lists.add(listResult{who: "lister (resourceVersion 0)", rv: parseRV(l.ResourceVersion), items: itemsOf(l.Items)})
			}
		case 2:
			minRV := acked()
			opts := metav1.ListOptions{Limit: 25}
			items := map[string]int64{}
			var rv int64
			for {
				l, err := assignments.List(rctx, opts)
				if err != nil {
					lists.fail("paged list", err)
					break
				}
				for k, v := range itemsOf(l.Items) {
					items[k] = v
				}
				if rv == 0 {
					rv = parseRV(l.ResourceVersion)
				}
				if l.Continue == "" {
					lists.add(listResult{who: "lister (pages of 25)", rv: rv, items: items, consistent: true, minRV: minRV})
					break
				}
				opts.Continue = l.Continue
			}
		}
		cancel()
	}
}

func parseRV(rv string) int64 {
	n, _ := strconv.ParseInt(rv, 10, 64)
	return n
}

// itemsOf maps each assignment's namespace/name to its resourceVersion.
func itemsOf(items []v1beta1.Assignment) map[string]int64 {
	m := make(map[string]int64, len(items))
	for _, a := range items {
		m[a.Namespace+"/"+a.Name] = parseRV(a.ResourceVersion)
	}
	return m
}

// noRetries lists without client-go's automatic retries of answers with
// Retry-After, so that the lister sees the server's own answer to each
// request: a 503 during an outage, not a client-side timeout after ten.
type noRetries struct{ rest.Interface }

func (c noRetries) List(ctx context.Context, opts metav1.ListOptions) (*v1beta1.AssignmentList, error) {
	out := &v1beta1.AssignmentList{}
	err := c.Get().Resource("assignments").VersionedParams(&opts, fleetscheme.ParameterCodec).
		MaxRetries(0).Do(ctx).Into(out)
	return out, err
}

// failures records the lister's failures, except those of a request the
// lister itself cancelled because the run ended.
type failures struct {
	*listLog
	ctx context.Context
}

func (f failures) fail(what string, err error) {
	if f.ctx.Err() == nil {
		f.listLog.fail(what, err)
	}
}
