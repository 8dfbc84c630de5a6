package fanout

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/shard"
)

func TestPlaceFor(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ShardedListAndWatch, true)
	onField := func(sel string) storage.SelectionPredicate {
		return storage.SelectionPredicate{Label: labels.Everything(), Field: fields.ParseSelectorOrDie(sel)}
	}
	onLabel := func(sel string) storage.SelectionPredicate {
		l, err := labels.Parse(sel)
		if err != nil {
			t.Fatal(err)
		}
		return storage.SelectionPredicate{Label: l, Field: fields.Everything()}
	}
	sharded := storage.SelectionPredicate{ShardSelector: objecttest.ShardSelector(shard.UIDPath, [2]string{"0x0000000000000000", "0x4000000000000000"})}
	shardedOnNode := onField("spec.nodeName=n1")
	shardedOnNode.ShardSelector = sharded.ShardSelector
	tests := []struct {
		name      string
		key       string
		recursive bool
		pred      storage.SelectionPredicate
		want      place
	}{
		{name: "everything", key: "/pods/", recursive: true, pred: storage.Everything, want: place{kind: byPrefix, value: "/pods/"}},
		{name: "namespace", key: "/pods/ns/", recursive: true, pred: storage.Everything, want: place{kind: byPrefix, value: "/pods/ns/"}},
		{name: "one object", key: "/pods/ns/a", pred: onField("metadata.name=a"), want: place{kind: byKey, value: "/pods/ns/a"}},
		{name: "one object, sharded", key: "/pods/ns/a", pred: sharded, want: place{kind: byKey, value: "/pods/ns/a"}},
		{name: "trigger", key: "/pods/", recursive: true, pred: onField("spec.nodeName=n1"), want: place{kind: byTrigger, value: "n1"}},
		{name: "trigger beats shard", key: "/pods/", recursive: true, pred: shardedOnNode, want: place{kind: byTrigger, value: "n1"}},
		{name: "trigger not pinned", key: "/pods/", recursive: true, pred: onField("spec.nodeName!=n1"), want: place{kind: byPrefix, value: "/pods/"}},
		{name: "name across namespaces", key: "/pods/", recursive: true, pred: onField("metadata.name=a"), want: place{kind: byName, value: "a"}},
		{name: "shard", key: "/pods/", recursive: true, pred: sharded, want: place{kind: byShard}},
		{name: "label", key: "/pods/", recursive: true, pred: onLabel("app=web,tier!=db"), want: place{kind: byLabel, value: "app=web"}},
		{name: "label in one value", key: "/pods/ns/", recursive: true, pred: onLabel("app in (web)"), want: place{kind: byLabel, value: "app=web"}},
		{name: "label in two values", key: "/pods/", recursive: true, pred: onLabel("app in (web,db)"), want: place{kind: byPrefix, value: "/pods/"}},
		{name: "label not equal", key: "/pods/", recursive: true, pred: onLabel("app!=web"), want: place{kind: byPrefix, value: "/pods/"}},
		{name: "name beats label", key: "/pods/", recursive: true, pred: storage.SelectionPredicate{Label: labels.SelectorFromSet(labels.Set{"app": "web"}),
			Field: fields.OneTermEqualSelector("metadata.name", "a")}, want: place{kind: byName, value: "a"}},
	}
	d := newTestDispatcher(8)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := mustWatcher(t, d.Dispatcher, tc.key, tc.recursive, tc.pred, 1)
			got := w.place
			if got.kind != tc.want.kind || got.value != tc.want.value || (got.kind == byShard) != (got.shard != nil) {
				t.Fatalf("placed at %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestWatcherIndexLookup files a watcher of every kind and checks that an
// event finds exactly the sets that may match it, each once, and that
// removing the watchers forgets their sets.
func TestWatcherIndexLookup(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ShardedListAndWatch, true)
	d := newTestDispatcher(8)
	obj := func(key, name, trigger, uid, ns string, lbls labels.Set) *object.Object {
		o := &object.Object{Key: key, Trigger: trigger}
		o.SetName(name)
		o.SetLabels(object.NewLabels(lbls))
		o.Hashes[shard.ByUID], o.Hashes[shard.ByNamespace] = shard.Hash(uid), shard.Hash(ns)
		return o
	}
	a := obj("/pods/ns1/a", "a", "n1", "uid-a", "ns1", labels.Set{"app": "web", "tier": "front"})
	aMoved := obj("/pods/ns1/a", "a", "n2", "uid-a", "ns1", labels.Set{"app": "db", "tier": "front"})
	uidA := fmt.Sprintf("0x%016x", shard.Hash("uid-a"))
	uidAEnd := fmt.Sprintf("0x%016x", shard.Hash("uid-a")+1)
	ns1 := fmt.Sprintf("0x%016x", shard.Hash("ns1"))
	ns1End := fmt.Sprintf("0x%016x", shard.Hash("ns1")+1)
	onField := func(sel string) storage.SelectionPredicate {
		return storage.SelectionPredicate{Label: labels.Everything(), Field: fields.ParseSelectorOrDie(sel)}
	}
	sharded := func(path string, bounds ...[2]string) storage.SelectionPredicate {
		return storage.SelectionPredicate{ShardSelector: objecttest.ShardSelector(path, bounds...)}
	}
	onLabel := func(sel string) storage.SelectionPredicate {
		l, err := labels.Parse(sel)
		if err != nil {
			t.Fatal(err)
		}
		return storage.SelectionPredicate{Label: l, Field: fields.Everything()}
	}
	watchers := map[string]struct {
		key       string
		recursive bool
		pred      storage.SelectionPredicate
		found     bool
	}{
		"everything":          {"/pods/", true, storage.Everything, true},
		"its namespace":       {"/pods/ns1/", true, storage.Everything, true},
		"other namespace":     {"/pods/ns2/", true, storage.Everything, false},
		"its key":             {"/pods/ns1/a", false, storage.Everything, true},
		"other key":           {"/pods/ns1/b", false, storage.Everything, false},
		"old trigger":         {"/pods/", true, onField("spec.nodeName=n1"), true},
		"new trigger":         {"/pods/", true, onField("spec.nodeName=n2"), true},
		"other trigger":       {"/pods/", true, onField("spec.nodeName=n3"), false},
		"its name":            {"/pods/", true, onField("metadata.name=a"), true},
		"other name":          {"/pods/", true, onField("metadata.name=b"), false},
		"old label":           {"/pods/", true, onLabel("app=web"), true},
		"new label":           {"/pods/", true, onLabel("app=db"), true},
		"unchanged label":     {"/pods/ns2/", true, onLabel("tier=front"), true},
		"other label":         {"/pods/", true, onLabel("app=cache"), false},
		"its uid, exactly":    {"/pods/", true, sharded(shard.UIDPath, [2]string{uidA, uidAEnd}), true},
		"its uid, ORed":       {"/pods/", true, sharded(shard.UIDPath, [2]string{"0x0000000000000000", "0x0000000000000001"}, [2]string{uidA, "0x10000000000000000"}), true},
		"uid space":           {"/pods/", true, sharded(shard.UIDPath, [2]string{"0x0000000000000000", "0x10000000000000000"}), true},
		"other uids":          {"/pods/", true, sharded(shard.UIDPath, [2]string{uidAEnd, "0x10000000000000000"}), false},
		"its namespace shard": {"/pods/", true, sharded(shard.NamespacePath, [2]string{ns1, ns1End}), true},
		"other ns shard":      {"/pods/", true, sharded(shard.NamespacePath, [2]string{"0x0000000000000000", ns1}), false},
	}
	byName := map[*watcherSet][]string{}
	var all []*Watcher
	for name, tc := range watchers {
		w := mustWatcher(t, d.Dispatcher, tc.key, tc.recursive, tc.pred, 1)
		d.synced.add(w)
		byName[w.set] = append(byName[w.set], name)
		all = append(all, w)
	}
	if got := d.synced.len(); got != len(watchers) {
		t.Fatalf("index holds %d watchers, want %d", got, len(watchers))
	}
	var found []string
	for _, s := range d.synced.lookup(&Event{Type: watch.Modified, Key: a.Key, Cur: aMoved, Prev: a}) {
		found = append(found, byName[s]...)
	}
	var want []string
	for name, tc := range watchers {
		if tc.found {
			want = append(want, name)
		}
	}
	slices.Sort(found)
	slices.Sort(want)
	if !slices.Equal(found, want) {
		t.Fatalf("lookup found %q,\nwant %q", found, want)
	}
	for _, w := range all {
		d.synced.remove(w)
	}
	for kind, sets := range d.synced.sets {
		if len(sets) != 0 {
			t.Errorf("sets of kind %d left after every watcher left: %v", kind, sets)
		}
	}
	for field, shards := range d.synced.shards {
		if len(shards.groups) != 0 || len(shards.appendSets(nil, 0)) != 0 {
			t.Errorf("shard groups of field %d left after every watcher left", field)
		}
	}
}

// TestSegmentTree checks the shard index against a scan of every group,
// for random groups of random, overlapping ranges, at random hashes and at
// every range's bounds.
func TestSegmentTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		x := newShardIndex()
		groups := rng.IntN(40) + 1
		for g := range groups {
			r := &shard.Selector{Text: fmt.Sprint(g)}
			for range rng.IntN(3) + 1 {
				lo := rng.Uint64()
				hi := lo
				if lo < math.MaxUint64 {
					hi += rng.Uint64N(math.MaxUint64 - lo)
				}
				if rng.IntN(8) == 0 {
					lo, hi = 0, math.MaxUint64
				}
				r.Ranges = append(r.Ranges, shard.Range{Lo: lo, Hi: hi})
			}
			r.Ranges = shard.MergeRanges(r.Ranges)
			x.set(r).place = place{kind: byShard, shard: r}
		}
		probes := []uint64{0, math.MaxUint64}
		for _, g := range x.groups {
			for _, r := range g.ranges {
				probes = append(probes, r.Lo, r.Hi, r.Lo-1, r.Hi+1)
			}
		}
		for range 200 {
			probes = append(probes, rng.Uint64())
		}
		for _, h := range probes {
			var got, want []string
			for _, s := range x.appendSets(nil, h) {
				got = append(got, s.place.shard.Text)
			}
			hashes := shard.Hashes{h, h}
			for sel, g := range x.groups {
				if (&shard.Selector{Ranges: g.ranges}).Matches(&hashes) {
					want = append(want, sel)
				}
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("round %d, hash %#x: tree found groups %v, a scan %v", round, h, got, want)
			}
		}
	}
}
