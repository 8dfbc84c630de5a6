package cacher

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/component-base/metrics/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/internal/corpus"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/packer"
)

// withCompression compresses the cache's objects, each pass of the packer
// run by the test.
func withCompression(o *setupOptions) {
	o.config = func(c *Config) { c.Compression, c.compressEvery = CompressionS2, -1 }
}

// withEagerCompression compresses every object a few milliseconds after
// it is written, in the background, as the conformance functions read.
func withEagerCompression(o *setupOptions) {
	o.config = func(c *Config) {
		c.Compression, c.compressEvery, c.compressWindow = CompressionS2, 5*time.Millisecond, -1
	}
}

// uncompressedTwin starts a second cache over c's etcd3 store that does
// not compress, and waits until it is ready.
func uncompressedTwin(t *testing.T, c *testCacher) *Cacher {
	t.Helper()
	cfg := c.cfg
	cfg.Compression, cfg.compressEvery = CompressionOff, 0
	twin, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(twin.Stop)
	waitReady(t, twin)
	return twin
}

// fakePacker gives c a packer whose window a fake clock times.
func fakePacker(c *testCacher, clk *clocktesting.FakeClock) {
	c.packer = packer.New(packer.Config{Objects: c.store, Codec: c.build.Codec().Compression(), Window: time.Minute, Clock: clk})
}

// realisticPods returns n pods that carry what the realistic corpus's
// objects do: an Assignment's JSON as their last-applied configuration,
// labels, and in one of ten a certificate's worth of random bytes.
func realisticPods(seed uint64, n int) []*example.Pod {
	applied := corpus.AssignmentsJSON(seed, n)
	random := corpus.Random(seed, n)
	pods := make([]*example.Pod, n)
	for i := range pods {
		p := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%04d", i), Namespace: fmt.Sprintf("ns-%d", i%5),
			Labels:      map[string]string{"app": fmt.Sprintf("app-%d", i%13), "tier": []string{"web", "db", "cache"}[i%3]},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(applied[i])}},
			Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i%10)}}
		if i%10 == 0 {
			p.Annotations["cert"] = base64.StdEncoding.EncodeToString(random[i][:min(len(random[i]), 1500)])
		}
		pods[i] = p
	}
	return pods
}

// TestCompressionRoundTrip: a cache that compresses serves every object,
// through every path (get, list, a list's items as the response writes
// them, gzipped, watch from the history, watch-list, watch from 0), byte
// for byte as a cache over the same etcd that does not: as listed, once
// compressed, beside recent versions kept as they are, and after a retrain
// compressed them all again against a new dictionary.
func TestCompressionRoundTrip(t *testing.T) {
	ctx := context.Background()
	on := newTestCacher(t, withCompression, withCodec(examplev1JSON))
	corruptBefore, _ := testutil.GetCounterMetricValue(on.metrics.corrupt)
	clk := clocktesting.NewFakeClock(time.Now())
	fakePacker(on, clk)
	off := uncompressedTwin(t, on)
	start := on.increaseRV(ctx, t)

	pods := realisticPods(1, 150)
	write := func(pods []*example.Pod, label string) int64 {
		t.Helper()
		var rv int64
		for _, p := range pods {
			p := p.DeepCopy()
			p.ResourceVersion = ""
			key := "/pods/" + p.Namespace + "/" + p.Name
			out := &example.Pod{}
			err := on.GuaranteedUpdate(ctx, key, out, true, nil, storage.SimpleUpdate(func(runtime.Object) (runtime.Object, error) {
				p.Labels["round"] = label
				return p, nil
			}), nil)
			if err != nil {
				t.Fatal(err)
			}
			if rv, err = strconv.ParseInt(out.ResourceVersion, 10, 64); err != nil {
				t.Fatal(err)
			}
		}
		return rv
	}
	rv := write(pods, "created")
	for _, p := range pods[:15] {
		out := &example.Pod{}
		if err := on.Delete(ctx, "/pods/"+p.Namespace+"/"+p.Name, out, nil, storage.ValidateAllObjectFunc, nil, storage.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rv, _ = strconv.ParseInt(out.ResourceVersion, 10, 64)
	}
	rv = max(rv, on.increaseRV(ctx, t))
	events := len(pods) + 15

	for _, stage := range []struct {
		name string
		// do changes the cache, and returns the writes it made, if any.
		do          func(t *testing.T) int
		wantTrained bool
		// packed and repacked are what the pass after do must compress.
		packed, repacked func(n int) bool
	}{
		{name: "as listed", do: func(*testing.T) int { return 0 }},
		{name: "compressed", wantTrained: true,
			packed: func(n int) bool { return n == len(pods)-15 }, repacked: none},
		{name: "beside recent versions", do: func(*testing.T) int {
			rv = write(pods[30:60], "updated")
			return 30
		}, packed: none, repacked: none},
		{name: "the recent versions compressed", do: func(*testing.T) int {
			clk.Step(2 * time.Minute)
			return 0
		}, packed: func(n int) bool { return n == 30 }, repacked: none},
		{name: "after a retrain", do: func(*testing.T) int {
			on.packer.Retrain()
			return 0
		}, wantTrained: true, packed: none, repacked: func(n int) bool { return n == len(pods)-15 }},
	} {
		t.Run(stage.name, func(t *testing.T) {
			if stage.do != nil {
				events += stage.do(t)
			}
			for _, c := range []*Cacher{on.Cacher, off} {
				if err := c.d.WaitFor(ctx, uint64(rv), wait.ForeverTestTimeout, c.requestProgress); err != nil {
					t.Fatal(err)
				}
			}
			if stage.packed != nil {
				res := on.packer.Pass()
				if res.Trained != stage.wantTrained || !stage.packed(res.Packed) || !stage.repacked(res.Repacked) || res.Failed > 0 {
					t.Fatalf("the pass: %+v", res)
				}
			}
			sameServed(ctx, t, on.Cacher, off, uint64(start), events)
			if stage.name == "after a retrain" {
				cur := on.build.Codec().Compression().Current()
				on.store.Latest().Scan("", true, "", func(o *object.Object) bool {
					if d := o.Packing().Dict; d != cur && d.ID() != 0 {
						t.Errorf("%s is compressed against dictionary %d, not the current one", o.Key, d.ID())
					}
					return true
				})
			}
		})
	}
	if n, err := testutil.GetCounterMetricValue(on.metrics.corrupt); err != nil || n != corruptBefore {
		t.Fatalf("corrupt reads counted: %v, %v; want none", n, err)
	}
}

func none(n int) bool { return n == 0 }

// sameServed checks that on serves what off does, byte for byte, through
// every path; events is how many events the history holds after start.
func sameServed(ctx context.Context, t *testing.T, on, off *Cacher, start uint64, events int) {
	t.Helper()
	both := func(read func(c *Cacher) ([][]byte, error)) [][]byte {
		t.Helper()
		want, err := read(off)
		if err != nil {
			t.Fatalf("without compression: %v", err)
		}
		got, err := read(on)
		if err != nil {
			t.Fatalf("with compression: %v", err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d answers, want %d", len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("answer %d:\n%.300s\nwant\n%.300s", i, got[i], want[i])
			}
		}
		return want
	}
	every := storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}
	keys := both(func(c *Cacher) ([][]byte, error) {
		var keys [][]byte
		c.store.Latest().Scan("", true, "", func(o *object.Object) bool {
			keys = append(keys, []byte(o.Key))
			return true
		})
		return keys, nil
	})
	if len(keys) == 0 {
		t.Fatal("no objects")
	}
	t.Run("get", func(t *testing.T) {
		both(func(c *Cacher) ([][]byte, error) {
			var out [][]byte
			for _, key := range keys {
				pod := &example.Pod{}
				if err := c.Get(ctx, string(key), storage.GetOptions{ResourceVersion: "0"}, pod); err != nil {
					return nil, err
				}
				b, err := runtime.Encode(examplev1JSON, pod)
				if err != nil {
					return nil, err
				}
				out = append(out, b)
			}
			return out, nil
		})
	})
	t.Run("list", func(t *testing.T) {
		both(func(c *Cacher) ([][]byte, error) {
			l := &example.PodList{}
			if err := c.GetList(ctx, "/pods/", every, l); err != nil {
				return nil, err
			}
			var out [][]byte
			for i := range l.Items {
				b, err := runtime.Encode(examplev1JSON, &l.Items[i])
				if err != nil {
					return nil, err
				}
				out = append(out, b)
			}
			return out, nil
		})
	})
	t.Run("a list's items, gzipped", func(t *testing.T) {
		both(func(c *Cacher) ([][]byte, error) {
			l := &sharingPodList{}
			if err := c.GetList(ctx, "/pods/", every, l); err != nil {
				return nil, err
			}
			var items [][]byte
			var body bytes.Buffer
			s := NewGzipStream(&body)
			for i, item := range l.shared {
				o := item.(*object.Object)
				open, n, ok := o.ListItem("json", examplev1JSON.Encode)
				if !ok {
					return nil, fmt.Errorf("item %d is not its bytes", i)
				}
				b, err := o.AppendItem(append([]byte(nil), open...))
				if err != nil || len(b) != len(open)+n {
					return nil, fmt.Errorf("item %d: %d bytes, %v; ListItem said %d", i, len(b), err, len(open)+n)
				}
				items = append(items, b)
				if err := s.WriteItem([]byte(",{"), o); err != nil {
					return nil, err
				}
			}
			if err := s.Close(); err != nil {
				return nil, err
			}
			zr, err := gzip.NewReader(&body)
			if err != nil {
				return nil, err
			}
			all, err := io.ReadAll(zr)
			return append(items, all), err
		})
	})
	for _, w := range []struct {
		name string
		opts storage.ListOptions
		n    int
	}{
		{"watch from the history", storage.ListOptions{ResourceVersion: strconv.FormatUint(start, 10), Recursive: true,
			Predicate: storage.Everything}, events},
		{"watch-list", storage.ListOptions{Recursive: true, SendInitialEvents: new(bool), Predicate: storage.Everything}, len(keys)},
		{"watch from 0", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, len(keys)},
	} {
		if w.opts.SendInitialEvents != nil {
			*w.opts.SendInitialEvents = true
		}
		t.Run(w.name, func(t *testing.T) {
			both(func(c *Cacher) ([][]byte, error) { return watched(ctx, c, w.opts, w.n) })
		})
	}
}

// watched returns the first n events of a watch with opts, each its type
// and its object as the JSON serializer writes it (through CacheEncode).
func watched(ctx context.Context, c *Cacher, opts storage.ListOptions, n int) ([][]byte, error) {
	w, err := c.Watch(ctx, "/pods/", opts)
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	timeout := time.After(wait.ForeverTestTimeout)
	var out [][]byte
	for len(out) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, fmt.Errorf("the watch ended after %d events", len(out))
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			if ev.Type == watch.Error {
				return nil, fmt.Errorf("error event after %d: %v", len(out), ev.Object)
			}
			b, err := runtime.Encode(examplev1JSON, ev.Object)
			if err != nil {
				return nil, err
			}
			out = append(out, append([]byte(string(ev.Type)+" "), b...))
		case <-timeout:
			return nil, fmt.Errorf("%d events, want %d", len(out), n)
		}
	}
	return out, nil
}

// TestCompressionCorruptRelists: a compressed object whose record is
// damaged is never served. A get of it, or a list that decodes it, is
// served by etcd instead (a list that writes the cache's bytes stops at
// it: TestCorruptObjectsRefused); the cache counts it, lists again, ending
// its watchers, and then serves the object, built anew, from itself.
func TestCompressionCorruptRelists(t *testing.T) {
	ctx := context.Background()
	const key = "/pods/ns-3/pod-0003"
	for _, tc := range []struct {
		name string
		// read reads the corrupt object, and returns it as it was served.
		read func(c *testCacher) (*example.Pod, error)
	}{
		{"get", func(c *testCacher) (*example.Pod, error) {
			got := &example.Pod{}
			return got, c.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, got)
		}},
		{"list", func(c *testCacher) (*example.Pod, error) {
			l := &example.PodList{}
			if err := c.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, l); err != nil {
				return nil, err
			}
			for i := range l.Items {
				if l.Items[i].Name == "pod-0003" {
					return &l.Items[i], nil
				}
			}
			return nil, fmt.Errorf("not in a list of %d", len(l.Items))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCacher(t, withCompression)
			var rv string
			for _, p := range realisticPods(2, 20) {
				out := &example.Pod{}
				if err := c.Create(ctx, "/pods/"+p.Namespace+"/"+p.Name, p, out, 0); err != nil {
					t.Fatal(err)
				}
				rv = out.ResourceVersion
			}
			want := &example.Pod{}
			if err := c.Get(ctx, key, storage.GetOptions{ResourceVersion: rv}, want); err != nil {
				t.Fatal(err)
			}
			if res := c.packer.Pass(); !res.Trained || res.Packed != 20 {
				t.Fatalf("the pass: %+v", res)
			}
			w, err := c.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: rv, Recursive: true, Predicate: storage.Everything})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			corrupt, ok := c.store.Get(key)
			if !ok || corrupt.Record() == nil {
				t.Fatal("the object is not compressed")
			}
			relists := func() float64 {
				n, err := testutil.GetCounterMetricValue(relistsCounter.WithLabelValues("", "pods", "unreadable"))
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := relists()
			corruptBefore, _ := testutil.GetCounterMetricValue(c.metrics.corrupt)
			rec := corrupt.Record()
			rec[len(rec)/2] ^= 0x40

			got, err := tc.read(c)
			if err != nil {
				t.Fatalf("reading the corrupt object: %v, want etcd's answer", err)
			}
			if !apiequality.Semantic.DeepEqual(got, want) {
				t.Fatalf("reading the corrupt object: %v, want %v", got, want)
			}
			if n, _ := testutil.GetCounterMetricValue(c.metrics.corrupt); n != corruptBefore+1 {
				t.Fatalf("corrupt reads counted: %v, want %v", n, corruptBefore+1)
			}
			// The cache lists again, ending its watchers, and holds the
			// object anew, and serves it.
			ended := time.After(wait.ForeverTestTimeout)
			for open := true; open; {
				select {
				case _, open = <-w.ResultChan():
				case <-ended:
					t.Fatal("the watcher was not ended")
				}
			}
			err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, wait.ForeverTestTimeout, true, func(context.Context) (bool, error) {
				o, ok := c.store.Get(key)
				return ok && o != corrupt, nil
			})
			if err != nil {
				t.Fatalf("the cache never listed again: %v", err)
			}
			if n := relists(); n != before+1 {
				t.Errorf("re-lists for an unreadable object: %v, want %v", n, before+1)
			}
			waitReady(t, c.Cacher)
			if got, err := tc.read(c); err != nil || !apiequality.Semantic.DeepEqual(got, want) {
				t.Fatalf("after the re-list: %v, %v", got, err)
			}
			if n, _ := testutil.GetCounterMetricValue(c.metrics.corrupt); n != corruptBefore+1 {
				t.Errorf("corrupt reads counted: %v, want %v", n, corruptBefore+1)
			}
		})
	}
}
