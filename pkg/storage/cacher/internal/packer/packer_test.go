package packer

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"runtime"
	"testing"
	"time"
	"weak"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/corpus"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/compress"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// event is a put, all the store needs of one.
type event struct{ o, prev *object.Object }

func (e event) RV() uint64 { return e.o.RV }
func (e event) Change() (watch.EventType, *object.Object, *object.Object) {
	return watch.Modified, e.o, e.prev
}

// fixture is a store of pods and the packer over it.
type fixture struct {
	t     *testing.T
	cc    *compress.Codec
	build *object.Builder
	store *store.Store[event]
	clk   *clocktesting.FakeClock
	p     *Packer
}

func newFixture(t *testing.T, cfg Config) *fixture {
	cc, err := compress.New(compress.Config{Algorithm: compress.S2, DictSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, cc: cc, store: store.New[event](nil), clk: clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))}
	f.build = object.NewBuilder(object.BuilderConfig{
		Codec:        objecttest.Codecs.LegacyCodec(examplev1.SchemeGroupVersion),
		Scheme:       objecttest.Scheme,
		KeyFunc:      func(obj kruntime.Object) (string, error) { return storage.NamespaceKeyFunc("/pods/", obj) },
		NewFunc:      func() kruntime.Object { return &example.Pod{} },
		GetAttrsFunc: objecttest.PodAttrs,
		Versioner:    storage.APIObjectVersioner{},
		Compression:  cc,
		Corrupt:      func(_ *object.Object, err error) { t.Errorf("corrupt: %v", err) },
	})
	cfg.Objects, cfg.Codec, cfg.Clock = f.store, cc, f.clk
	if cfg.Window == 0 {
		cfg.Window = time.Minute
	}
	f.p = New(cfg)
	return f
}

// pods builds n pods named from 0, at resourceVersions from rv, whose
// last-applied configuration is an Assignment's JSON, or random bytes.
func (f *fixture) pods(n int, rv uint64, random bool) []*object.Object {
	applied := corpus.AssignmentsJSON(rv, n)
	if random {
		applied = corpus.Random(rv, n)
	}
	objs := make([]*object.Object, n)
	for i := range objs {
		p := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%04d", i), Namespace: "ns",
			ResourceVersion: fmt.Sprint(rv + uint64(i)),
			Annotations:     map[string]string{"applied": base64.StdEncoding.EncodeToString(applied[i])}}}
		o, err := f.build.Build(p)
		if err != nil {
			f.t.Fatal(err)
		}
		objs[i] = o
	}
	return objs
}

// put applies objs to the store as new versions.
func (f *fixture) put(objs []*object.Object) {
	for _, o := range objs {
		prev, _ := f.store.Get(o.Key)
		f.store.Apply(event{o: o, prev: prev})
	}
}

// packed counts the store's objects compressed, and those against d.
func (f *fixture) packed(d *compress.Dictionary) (packed, against int) {
	f.store.Latest().Scan("", true, "", func(o *object.Object) bool {
		if pk := o.Packing(); pk.Dict != nil {
			packed++
			if pk.Dict == d {
				against++
			}
		}
		return true
	})
	return packed, against
}

// TestPassWindow: the first pass trains and compresses what the cache
// listed; a later version stays as it is until a pass finds it a whole
// window old, and is compressed then.
func TestPassWindow(t *testing.T) {
	f := newFixture(t, Config{})
	if res := f.p.Pass(); res != (Result{}) {
		t.Fatalf("a pass over an empty store: %+v", res)
	}
	f.store.Replace(f.pods(50, 100, false), 149)
	updated := f.pods(10, 200, false)
	for _, step := range []struct {
		name string
		do   func()
		want Result
		// packed is how many of the store's objects are compressed after.
		packed int
	}{
		{"the first pass", func() {}, Result{Trained: true, Packed: 50}, 50},
		{"new versions", func() { f.clk.Step(10 * time.Second); f.put(updated) }, Result{}, 40},
		{"half a window later", func() { f.clk.Step(30 * time.Second) }, Result{}, 40},
		{"a window after the first pass", func() { f.clk.Step(21 * time.Second) }, Result{}, 40},
		{"a window after the pass that saw them", func() { f.clk.Step(10 * time.Second) }, Result{Packed: 10}, 50},
		{"nothing new", func() { f.clk.Step(time.Hour) }, Result{}, 50},
	} {
		step.do()
		if res := f.p.Pass(); res != step.want {
			t.Fatalf("%s: %+v, want %+v", step.name, res, step.want)
		}
		if n, _ := f.packed(nil); n != step.packed {
			t.Fatalf("%s: %d objects compressed, want %d", step.name, n, step.packed)
		}
	}
	for _, o := range updated {
		if b, err := o.Bytes(nil); err != nil || !bytes.Contains(b, []byte(o.Name())) {
			t.Fatalf("%s: %v", o.Key, err)
		}
	}
}

// TestRetrain: objects of another shape than the dictionary's compress
// worse; once they are most of the store, the next pass trains a new
// dictionary and compresses every object again against it, and the old
// dictionary, retired, is collected. Objects that do not compress are kept
// as they are, and not compressed again.
func TestRetrain(t *testing.T) {
	f := newFixture(t, Config{MinJudged: 20})
	f.store.Replace(f.pods(60, 100, false), 159)
	if res := f.p.Pass(); !res.Trained || res.Packed != 60 {
		t.Fatalf("the first pass: %+v", res)
	}
	first := weak.Make(f.cc.Current())
	// Another shape: the pods carry their annotation as JSON, not base64.
	reshaped := make([]*object.Object, 60)
	applied := corpus.AgentsJSON(7, 60)
	for i := range reshaped {
		p := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%04d", i), Namespace: "ns",
			ResourceVersion: fmt.Sprint(300 + i), Labels: map[string]string{"shape": "agent"},
			Annotations: map[string]string{"applied": string(applied[i])}}}
		o, err := f.build.Build(p)
		if err != nil {
			t.Fatal(err)
		}
		reshaped[i] = o
	}
	f.put(reshaped)
	f.p.Pass() // sees them
	f.clk.Step(2 * time.Minute)
	if res := f.p.Pass(); res.Trained || res.Packed != 60 {
		t.Fatalf("compressing the new shape: %+v", res)
	}
	res := f.p.Pass()
	if !res.Trained || res.Repacked != 60 || res.Failed != 0 {
		t.Fatalf("the pass after: %+v, want a retrain that compressed all 60 again", res)
	}
	if _, against := f.packed(f.cc.Current()); against != 60 {
		t.Fatalf("%d objects against the new dictionary, want 60", against)
	}
	if res := f.p.Pass(); res != (Result{}) {
		t.Fatalf("the pass after the retrain: %+v, want nothing to do", res)
	}
	// The first dictionary's last records went with the old versions,
	// once no snapshot holds them.
	reshaped = nil
	f.store.Prune(f.store.Latest().RV)
	runtime.GC()
	if first.Value() != nil {
		t.Error("the first dictionary is still held")
	}

	// Random bytes, as base64, which S2 does not compress: the pods that
	// hold little else are kept as they are, in a record of their own, and
	// left alone by later passes and retrains.
	random := f.pods(60, 500, true)
	f.put(random)
	f.p.Pass()
	f.clk.Step(2 * time.Minute)
	f.p.Pass()
	kept := map[*object.Object][]byte{}
	for _, o := range random {
		if pk := o.Packing(); pk.Dict != nil && pk.Dict.ID() == 0 {
			if pk.Record != o.Len()+5 {
				t.Fatalf("%s: a record of %d bytes for %d kept as they are", o.Key, pk.Record, o.Len())
			}
			kept[o] = o.Record()
		}
	}
	if len(kept) == 0 {
		t.Fatal("every pod of random bytes compressed")
	}
	f.p.Retrain()
	if res := f.p.Pass(); !res.Trained || res.Repacked != len(random)-len(kept) {
		t.Fatalf("a retrain over random bytes: %+v, want %d compressed again", res, len(random)-len(kept))
	}
	for o, rec := range kept {
		if got := o.Record(); &got[0] != &rec[0] {
			t.Fatalf("%s was compressed again", o.Key)
		}
	}
}
