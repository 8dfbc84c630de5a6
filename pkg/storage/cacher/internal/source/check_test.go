package source

import (
	"context"
	"strings"
	"testing"
)

// TestCheck checks that the consistency check finds each kind of
// difference between the cache and etcd's keys, names the first, and asks
// for a re-list, which ends the watchers; and that an intact cache passes.
func TestCheck(t *testing.T) {
	intact := fakeKeys{"/pods/ns/a": 2, "/pods/ns/b": 3, "/pods/ns/c": 4}
	tests := []struct {
		name string
		// etcd's keys, against a cache holding a@2, b@3 and c@4.
		keys fakeKeys
		diff string
	}{
		{name: "intact", keys: intact},
		{name: "missing from the cache", keys: with(intact, "/pods/ns/bb", 5), diff: "etcd holds /pods/ns/bb at resourceVersion 5; the cache does not hold it"},
		{name: "missing from the cache, after the last key", keys: with(intact, "/pods/ns/z", 5), diff: "etcd holds /pods/ns/z"},
		{name: "missing from etcd", keys: with(intact, "/pods/ns/b", 0), diff: "the cache holds /pods/ns/b at resourceVersion 3; etcd does not hold it"},
		{name: "missing from etcd, the last key", keys: with(intact, "/pods/ns/c", 0), diff: "the cache holds /pods/ns/c at resourceVersion 4; etcd does not hold it"},
		{name: "stale in the cache", keys: with(intact, "/pods/ns/a", 3), diff: "the cache holds /pods/ns/a at resourceVersion 2; etcd at 3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			etcd := newFakeEtcd(4, pod("a", 2), pod("b", 3), pod("c", 4))
			h := newHarness(etcd, tc.keys)
			h.run(t)
			etcd.next(t)
			h.waitState(t, Ready)
			r := h.src.Check(context.Background())
			want := CheckFailure
			if tc.diff == "" {
				want = CheckSuccess
			}
			if r.Status != want || !strings.Contains(r.Diff, tc.diff) || r.RV != 4 {
				t.Fatalf("got %s at %d, %q (%v); want %s at 4, naming %q", r.Status, r.RV, r.Diff, r.Err, want, tc.diff)
			}
			if n := h.n.get("checked/" + want); n != 1 {
				t.Errorf("checks counted as %s: %d, want 1", want, n)
			}
			if want == CheckSuccess {
				return
			}
			h.nextWatch(t)
			if n, ended := h.n.get("relisted/"+EndInconsistent), h.cache.ended(); n != 1 || len(ended) != 1 || h.cache.lists() != 2 {
				t.Errorf("after a failed check: %d re-lists, watchers ended %q, %d lists; want 1, once, 2", n, ended, h.cache.lists())
			}
		})
	}
}

// with returns keys with key at rev, or without it for rev 0.
func with(keys fakeKeys, key string, rev int64) fakeKeys {
	out := fakeKeys{}
	for k, v := range keys {
		out[k] = v
	}
	if rev == 0 {
		delete(out, key)
	} else {
		out[key] = rev
	}
	return out
}

// TestCheckNotReady checks that a cache not yet listed is not compared.
func TestCheckNotReady(t *testing.T) {
	h := newHarness(newFakeEtcd(1), fakeKeys{})
	if r := h.src.Check(context.Background()); r.Status != CheckError {
		t.Errorf("a check before the list: %s, want %s", r.Status, CheckError)
	}
}
