package object

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/internal/corpus"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/compress"
)

// realisticPods returns n pods that carry what the realistic corpus's
// objects do: an Assignment's JSON as their last-applied configuration,
// labels, and in one of ten random bytes, a certificate's worth.
func realisticPods(seed uint64, n int) []*example.Pod {
	applied := corpus.AssignmentsJSON(seed, n)
	random := corpus.Random(seed, n)
	pods := make([]*example.Pod, n)
	for i := range pods {
		p := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d-%04d", seed, i), Namespace: fmt.Sprintf("ns-%d", i%7),
			ResourceVersion: fmt.Sprint(100 + i), UID: types.UID(fmt.Sprint("uid-", seed*1000+uint64(i))),
			Labels:      map[string]string{"app": fmt.Sprintf("app-%d", i%13), "tier": []string{"web", "db", "cache"}[i%3]},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(applied[i])}},
			Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%d", i%10), Hostname: "host<&>"}}
		if i%10 == 0 {
			p.Annotations["cert"] = base64.StdEncoding.EncodeToString(random[i][:min(len(random[i]), 1500)])
		}
		pods[i] = p
	}
	return pods
}

// newCompressedIngest is newPodIngest's Builder for a cache that
// compresses with cc and is told of corrupt objects by corrupt.
func newCompressedIngest(cc *compress.Codec, corrupt func(*Object, error)) *Builder {
	cfg := newPodIngest().cfg
	cfg.Compression, cfg.Corrupt = cc, corrupt
	return NewBuilder(cfg)
}

// readers are every way the cache reads an object's bytes, each returning
// what it read.
var readers = []struct {
	name string
	read func(o *Object) ([]byte, error)
}{
	{"Bytes", func(o *Object) ([]byte, error) {
		b, err := o.Bytes(nil)
		return bytes.Clone(b), err
	}},
	{"Bytes into a buffer too small", func(o *Object) ([]byte, error) {
		b, err := o.Bytes(make([]byte, 3))
		return bytes.Clone(b), err
	}},
	{"AppendBytes", func(o *Object) ([]byte, error) { return o.AppendBytes([]byte("before")) }},
	{"Len, StoredSize and Size", func(o *Object) ([]byte, error) {
		return fmt.Appendf(nil, "%d %d %d", o.Len(), o.StoredSize(), o.Size()), nil
	}},
	{"ListItem and AppendItem", func(o *Object) ([]byte, error) {
		open, n, ok := o.ListItem("json", codecs.LegacyCodec(examplev1.SchemeGroupVersion).Encode)
		if !ok {
			return nil, errors.New("not a list item")
		}
		item, err := o.AppendItem(make([]byte, 0, 64<<10))
		if err == nil && len(item) != n {
			err = fmt.Errorf("ListItem said %d bytes, AppendItem appended %d", n, len(item))
		}
		return append(bytes.Clone(open), item...), err
	}},
	{"AppendItem with little room", func(o *Object) ([]byte, error) {
		return o.AppendItem(make([]byte, 3, 10))
	}},
	{"Decode", func(o *Object) ([]byte, error) {
		obj, err := o.Decode()
		if err != nil {
			return nil, err
		}
		return runtime.Encode(codecs.LegacyCodec(examplev1.SchemeGroupVersion), obj)
	}},
	{"At", func(o *Object) ([]byte, error) {
		at, err := o.At(storage.APIObjectVersioner{}, o.RV+1)
		if err != nil {
			return nil, err
		}
		return at.Bytes(nil)
	}},
	{"CacheEncode", func(o *Object) ([]byte, error) {
		var buf bytes.Buffer
		err := NewCaching(o).CacheEncode("json", codecs.LegacyCodec(examplev1.SchemeGroupVersion).Encode, &buf)
		return buf.Bytes(), err
	}},
	{"a watch event's frame", func(o *Object) ([]byte, error) {
		return appendEvent([]byte("spare"), []byte(`{"type":"ADDED","object":`), o)
	}},
}

// TestPackedObjectsRead: every reader of an object's bytes reads the same
// from the object compressed as from the object a cache that does not
// compress keeps, as built, compressed, and compressed again after a
// retrain retired the first dictionary; lists of them, gzipped, too.
func TestPackedObjectsRead(t *testing.T) {
	pods := realisticPods(1, 120)
	cc, err := compress.New(compress.Config{Algorithm: compress.S2, DictSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var corrupt []error
	packedIngest := newCompressedIngest(cc, func(_ *Object, err error) { corrupt = append(corrupt, err) })
	plainIngest := newPodIngest()
	plain, packed := make([]*Object, len(pods)), make([]*Object, len(pods))
	for i, p := range pods {
		if plain[i], err = plainIngest.Build(p); err != nil {
			t.Fatal(err)
		}
		if packed[i], err = packedIngest.Build(p); err != nil {
			t.Fatal(err)
		}
		if packed[i].Raw != nil || packed[i].Key != plain[i].Key || packed[i].Trigger != plain[i].Trigger {
			t.Fatalf("pod %d: Raw %v, key %q, trigger %q", i, packed[i].Raw != nil, packed[i].Key, packed[i].Trigger)
		}
	}
	var scratch Scratch
	pack := func(wantDict *compress.Dictionary) {
		t.Helper()
		for i, o := range packed {
			if err := o.Pack(&scratch); err != nil {
				t.Fatalf("pod %d: %v", i, err)
			}
			if pk := o.Packing(); !pk.Packable || pk.Dict == nil || (pk.Dict != wantDict && pk.Dict.ID() != 0) {
				t.Fatalf("pod %d: packed as %+v", i, pk)
			}
		}
	}
	train := func(seed uint64) uint32 {
		t.Helper()
		var samples [][]byte
		for _, p := range realisticPods(seed, 60) {
			samples = append(samples, podObject(p).Raw)
		}
		id, err := cc.Train(samples)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	for _, stage := range []struct {
		name   string
		before func()
	}{
		{"as built", func() {}},
		{"compressed", func() {
			train(2)
			pack(cc.Current())
		}},
		{"after a retrain", func() {
			first := cc.Current().ID()
			train(3)
			cc.Retire(first)
			pack(cc.Current())
		}},
	} {
		t.Run(stage.name, func(t *testing.T) {
			stage.before()
			for _, r := range readers {
				for i := range pods {
					want, err := r.read(plain[i])
					if err != nil {
						t.Fatalf("%s, pod %d, not compressed: %v", r.name, i, err)
					}
					got, err := r.read(packed[i])
					if err != nil || !bytes.Equal(got, want) {
						t.Fatalf("%s, pod %d: %v, or\n%.300s\nwant\n%.300s", r.name, i, err, got, want)
					}
				}
			}
			// A list whose items are compressed objects, gzipped, sends what
			// a list of the same objects kept as they are sends; twice, the
			// second sharing the runs the first compressed.
			want := listed(t, plain).sent
			for range 2 {
				got := listed(t, packed)
				if !bytes.Equal(got.sent, want) || !bytes.Equal(oneMember(t, got.body), want) {
					t.Fatal("a list of compressed objects differs")
				}
			}
			if n := len(packed[0].Record()); stage.name != "as built" && (n == 0 || n >= packed[0].Len()) {
				t.Errorf("the first pod's record is %d bytes, for %d", n, packed[0].Len())
			}
		})
	}
	if len(corrupt) > 0 {
		t.Fatalf("corruption reported: %v", corrupt)
	}
}

// TestCorruptObjectsRefused: an object whose record is damaged anywhere is
// never read: every reader fails with ErrCorrupt, returns none of its
// bytes, and the cache is told, each time.
func TestCorruptObjectsRefused(t *testing.T) {
	cc, err := compress.New(compress.Config{Algorithm: compress.S2, DictSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var samples [][]byte
	for _, p := range realisticPods(2, 60) {
		samples = append(samples, podObject(p).Raw)
	}
	if _, err := cc.Train(samples); err != nil {
		t.Fatal(err)
	}
	pod := realisticPods(1, 1)[0]
	for _, tc := range []struct {
		name   string
		damage func(rec []byte)
	}{
		{"the format byte", func(rec []byte) { rec[0] = 0x00 }},
		{"another format", func(rec []byte) { rec[0] = 0x02 }},
		{"the checksum", func(rec []byte) { rec[2] ^= 0x10 }},
		{"the dictionary id", func(rec []byte) { rec[5] ^= 0x01 }},
		{"the length", func(rec []byte) { rec[6] ^= 0x04 }},
		{"the middle", func(rec []byte) { rec[len(rec)/2] ^= 0x20 }},
		{"the last byte", func(rec []byte) { rec[len(rec)-1] ^= 0x01 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var told int
			b := newCompressedIngest(cc, func(o *Object, err error) {
				if !errors.Is(err, ErrCorrupt) {
					t.Errorf("told of %v", err)
				}
				told++
			})
			// A healthy object first: the encoders are learnt, as in a
			// cache that served before.
			healthy, err := b.Build(realisticPods(3, 1)[0])
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range readers {
				if _, err := r.read(healthy); err != nil {
					t.Fatalf("%s, a healthy object: %v", r.name, err)
				}
			}
			o, err := b.Build(pod)
			if err != nil {
				t.Fatal(err)
			}
			if err := o.Pack(&Scratch{}); err != nil {
				t.Fatal(err)
			}
			tc.damage(o.Record())
			for _, r := range readers {
				if r.name == "Len, StoredSize and Size" {
					continue // they read no record
				}
				before := told
				got, err := r.read(o)
				if !errors.Is(err, ErrCorrupt) {
					t.Errorf("%s: %v, want ErrCorrupt", r.name, err)
				}
				if bytes.Contains(got, []byte(pod.Name)) {
					t.Errorf("%s returned bytes of the object: %.100q", r.name, got)
				}
				if told == before {
					t.Errorf("%s: the cache was not told", r.name)
				}
			}
			// A list being written stops at it, as it writes it, or as it
			// compresses the run it begins.
			s := NewGzipStream(io.Discard)
			err = s.WriteItem([]byte("{"), o)
			if err == nil {
				err = s.Close()
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("a list with it: %v, want ErrCorrupt", err)
			}
			// Compressed again, it stays as it was.
			if err := o.Pack(&Scratch{}); !errors.Is(err, ErrCorrupt) {
				t.Errorf("packed again: %v, want ErrCorrupt", err)
			}
		})
	}
}
