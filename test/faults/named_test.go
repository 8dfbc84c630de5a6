package faults

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

func TestSelectorKeyOf(t *testing.T) {
	tests := []struct {
		sel  selector
		key  string
		want bool
	}{
		{nameSelector("a", "x"), "a/x", true},
		{selector{namespace: "a", field: "metadata.name==x"}, "a/x", true},
		{selector{namespace: "a", field: "metadata.name=x,status.phase=Running"}, "a/x", true},
		{selector{resource: agentsRes, field: "metadata.name=x"}, "x", true},
		{selector{field: "metadata.name=x"}, "", false}, // every namespace
		{selector{namespace: "a", field: "metadata.name!=x"}, "", false},
		{selector{namespace: "a"}, "", false},
		{selector{label: "tier=gold"}, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.sel.String(), func(t *testing.T) {
			if key, ok := tc.sel.keyOf(); key != tc.key || ok != tc.want {
				t.Errorf("keyOf() = %q, %v, want %q, %v", key, ok, tc.key, tc.want)
			}
		})
	}
}

// TestNamedChecksAgree checks that a single-object selector's checks from
// its key's changes alone (changesOf, checkList) find what the checks over
// every change find, on etcd's own history of transactions that create,
// update and delete several keys at a revision, for right and wrong
// lists and streams at every revision.
func TestNamedChecksAgree(t *testing.T) {
	bin := testkit.Build(t, testkit.Etcd)[0]
	c := startCluster(t, testkit.EtcdConfig{Bin: bin, Dir: filepath.Join(t.TempDir(), "etcd"), Members: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newTxnWriter(c.client, 1, func(int64) {})
	keys := []string{"a/x", "a/y", "b/x", "b/z"}
	put := func(ks ...string) {
		t.Helper()
		vals, err := w.values(ks)
		if err != nil {
			t.Fatal(err)
		}
		var ops []clientv3.Op
		for i, k := range ks {
			ops = append(ops, clientv3.OpPut(etcdPrefix+k, vals[i]))
		}
		if _, err := c.client.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	put(keys[:2]...)
	h, err := startTruth(ctx, c.truthClient, etcdPrefix)
	if err != nil {
		t.Fatal(err)
	}
	put(keys...)
	if _, err := c.client.Delete(ctx, etcdPrefix+"a/x"); err != nil {
		t.Fatal(err)
	}
	put("a/y", "b/z")
	put("a/x", "b/x")
	head, err := c.head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.WaitFor(ctx, c.truthClient, head, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	e := &env{truth: h, agentTruth: h}
	all, _ := h.Changes()
	for _, key := range append(keys, "a/none") {
		ns, name := key[:1], key[2:]
		sel := nameSelector(ns, name)
		m, err := newMatcher(sel)
		if err != nil {
			t.Fatal(err)
		}
		for rev := h.Start; rev <= head; rev++ {
			right := map[string]int64{}
			for k, v := range h.StateAt(rev) {
				if m.matches(v.Obj) {
					right[k] = v.Rev
				}
			}
			wrong := map[string]int64{key: rev + 1}
			for _, items := range []map[string]int64{right, wrong, {}} {
				l := watchcheck.List{Who: "list", Rev: rev, Items: items}
				if got, want := e.checkList(sel, m, l), watchcheck.CheckList(h, m.matches, l); got.Total() != want.Total() || got.Lists != want.Lists {
					t.Errorf("%s at %d, items %v: checkList found %v, CheckList %v", key, rev, items, got, want)
				}
			}
			named, err := e.changesOf(sel)
			if err != nil {
				t.Fatal(err)
			}
			events := watchcheck.Expected(all, m.matches, rev, head)
			for i, seg := range []watchcheck.Segment{{From: rev, Items: events}, {From: rev, Items: events[min(1, len(events)):]}} {
				got := watchcheck.CheckSegment("s", named, m.matches, seg)
				want := watchcheck.CheckSegment("s", all, m.matches, seg)
				if fmt.Sprint(got.Total(), got.Split) != fmt.Sprint(want.Total(), want.Split) {
					t.Errorf("%s from %d, segment %d: %v from its changes, %v from every change", key, rev, i, got, want)
				}
			}
		}
	}
}
