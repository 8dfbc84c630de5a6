package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	storagevalue "k8s.io/apiserver/pkg/storage/value"

	"github.com/cached-apiserver/cached-apiserver/internal/embedetcd"
	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object/objecttest"
)

// prefixTransformer stores values behind a prefix and checks that each
// is read with its own key as authenticated data, as encryption at rest
// does.
type prefixTransformer struct{}

const storedPrefix = "enc:"

func (prefixTransformer) TransformFromStorage(_ context.Context, data []byte, dataCtx storagevalue.Context) ([]byte, bool, error) {
	rest, ok := bytes.CutPrefix(data, []byte(storedPrefix))
	if !ok {
		return nil, false, errors.New("not transformed")
	}
	key, rest, ok := bytes.Cut(rest, []byte("|"))
	if !ok || !bytes.Equal(key, dataCtx.AuthenticatedData()) {
		return nil, false, fmt.Errorf("stored for %q, read for %q", key, dataCtx.AuthenticatedData())
	}
	return rest, false, nil
}

func (prefixTransformer) TransformToStorage(_ context.Context, data []byte, dataCtx storagevalue.Context) ([]byte, error) {
	return append([]byte(storedPrefix+string(dataCtx.AuthenticatedData())+"|"), data...), nil
}

// etcdChangesFixture is EtcdChanges over a real etcd, with the pods of
// namespace ns under /registry/pods/.
type etcdChangesFixture struct {
	cli     *clientv3.Client
	changes *EtcdChanges
}

func newEtcdChangesFixture(t *testing.T) *etcdChangesFixture {
	t.Helper()
	e, url, err := embedetcd.Start(embedetcd.Config{Dir: t.TempDir(), Throwaway: true})
	if err != nil {
		t.Fatal(err)
	}
	// Stopped before its directory is removed (cleanups run last first).
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	codec := objecttest.Codecs.LegacyCodec(examplev1.SchemeGroupVersion)
	decode := func(data []byte, rev uint64) (runtime.Object, error) {
		obj, _, err := codec.Decode(data, nil, nil)
		if err != nil {
			return nil, err
		}
		return obj, storage.APIObjectVersioner{}.UpdateObject(obj, rev)
	}
	return &etcdChangesFixture{cli: cli, changes: NewEtcdChanges(EtcdChangesConfig{EtcdReadConfig: EtcdReadConfig{Client: cli, StoragePrefix: "/registry",
		ResourcePrefix: "/pods", Transformer: prefixTransformer{}, Decode: decode}})}
}

// value is what the etcd3 store keeps for pod name: its JSON, transformed.
func (f *etcdChangesFixture) stored(t *testing.T, name string) string {
	t.Helper()
	return f.storedPod(t, &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}})
}

// storedPod is pod as the etcd3 store writes it.
func (f *etcdChangesFixture) storedPod(t *testing.T, pod *example.Pod) string {
	t.Helper()
	var buf bytes.Buffer
	if err := objecttest.Codecs.LegacyCodec(examplev1.SchemeGroupVersion).Encode(pod, &buf); err != nil {
		t.Fatal(err)
	}
	out, _ := prefixTransformer{}.TransformToStorage(context.Background(), buf.Bytes(), storagevalue.DefaultContext(etcdKey(pod.Name)))
	return string(out)
}

func etcdKey(name string) string { return "/registry/pods/ns/" + name }

// next returns the stream's next response.
func next(t *testing.T, s ChangeStream) Response {
	t.Helper()
	r, ok := testkit.Recv(t, s.Responses(), "a response")
	if !ok {
		t.Fatal("the stream closed")
	}
	return r
}

// describe is a response's changes as "put|del key@rev name".
func describe(r Response) []string {
	var out []string
	for _, c := range r.Changes {
		op := "put"
		if c.Deleted {
			op = "del"
		}
		name := "<none>"
		if m, err := meta.Accessor(c.Object); c.Object != nil && err == nil {
			name = fmt.Sprintf("%s@%s", m.GetName(), m.GetResourceVersion())
		}
		out = append(out, fmt.Sprintf("%s %s@%d %s", op, c.Key, c.Rev, name))
	}
	return out
}

// TestEtcdChanges reads a real etcd's changes: a transaction's puts, and a
// deletion of several keys, each come as one revision whole with every
// value read through the transformer at its revision; a progress request
// is answered on the watch's own stream; an unreadable value and a
// compacted start end the watch, both with a re-list; and once closed, a
// watch's progress request cannot open a stream.
func TestEtcdChanges(t *testing.T) {
	f := newEtcdChangesFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start, err := f.cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	rev0 := uint64(start.Header.Revision)
	s := f.changes.Watch(ctx, rev0)
	defer s.Close()

	// A transaction of three puts, and one key outside the resource.
	txn, err := f.cli.Txn(ctx).Then(clientv3.OpPut(etcdKey("a"), f.stored(t, "a")), clientv3.OpPut(etcdKey("b"), f.stored(t, "b")),
		clientv3.OpPut(etcdKey("c"), f.stored(t, "c")), clientv3.OpPut("/registry/podsx/ns/z", "ignored")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	r1 := uint64(txn.Header.Revision)
	del, err := f.cli.Delete(ctx, "/registry/pods/ns/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	r2 := uint64(del.Header.Revision)
	var got []string
	for len(got) < 6 {
		got = append(got, describe(next(t, s))...)
	}
	want := []string{
		fmt.Sprintf("put /pods/ns/a@%d a@%d", r1, r1), fmt.Sprintf("put /pods/ns/b@%d b@%d", r1, r1), fmt.Sprintf("put /pods/ns/c@%d c@%d", r1, r1),
		fmt.Sprintf("del /pods/ns/a@%d a@%d", r2, r2), fmt.Sprintf("del /pods/ns/b@%d b@%d", r2, r2), fmt.Sprintf("del /pods/ns/c@%d c@%d", r2, r2),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("changes:\n%q\nwant\n%q", got, want)
	}

	if err := s.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	if r := next(t, s); r.Progress < r2 || len(r.Changes) > 0 {
		t.Fatalf("after a progress request: %+v, want a notification at %d or later", r, r2)
	}

	// A value the transformer cannot read ends the watch, with a re-list.
	if _, err := f.cli.Put(ctx, etcdKey("bad"), "not transformed"); err != nil {
		t.Fatal(err)
	}
	if r := next(t, s); r.End == nil || r.End.Reason != EndUnreadable || !r.End.Relist {
		t.Fatalf("after an unreadable value: %+v, want the end, unreadable, with a re-list", r)
	}
	s.Close()
	if err := s.RequestProgress(ctx); err == nil {
		t.Error("a closed watch's progress request succeeded: it opened a stream no watch uses")
	}

	// A watch from before a compaction ends at once, with a re-list.
	if _, err := f.cli.Compact(ctx, int64(r2)); err != nil {
		t.Fatal(err)
	}
	old := f.changes.Watch(ctx, rev0)
	defer old.Close()
	if r := next(t, old); r.End == nil || r.End.Reason != EndCompacted || !r.End.Relist {
		t.Fatalf("a watch from before the compaction: %+v, want the end, compacted, with a re-list", r)
	}
}

// TestEtcdChangesWatchReturnsAtOnce checks that opening a watch returns at
// once on a member that takes the stream and never answers, and that the
// watch ends when closed: etcd's client returns a watch only once etcd
// answered that it created it, and the cache, waiting there, checked no
// silence, and handled no re-list or progress request (issue 65).
func TestEtcdChangesWatchReturnsAtOnce(t *testing.T) {
	e, url, err := embedetcd.Start(embedetcd.Config{Dir: t.TempDir(), Throwaway: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	proxy, err := testkit.NewProxy(strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.URL()}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := cli.Get(ctx, "/registry/pods/"); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole()
	changes := NewEtcdChanges(EtcdChangesConfig{EtcdReadConfig: EtcdReadConfig{Client: cli, StoragePrefix: "/registry", ResourcePrefix: "/pods",
		Decode: func([]byte, uint64) (runtime.Object, error) { return &example.Pod{}, nil }}})
	opened := make(chan ChangeStream, 1)
	go func() { opened <- changes.Watch(ctx, 1) }()
	var s ChangeStream
	select {
	case s = <-opened:
	case <-time.After(2 * time.Second):
		cancel() // unblocks it, for the test to end
		t.Fatal("opening a watch on a member that does not answer did not return in 2s")
	}
	if err := s.RequestProgress(ctx); err != nil {
		t.Errorf("a progress request before the watch exists: %v, want it held for the watch", err)
	}
	select {
	case r := <-s.Responses():
		t.Fatalf("a response from a member that does not answer: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	testkit.Recv(t, closed, "the watch's end after Close")
}

// TestEtcdChangesChunksAndHeld checks that a watch catching up on history
// hands it over in Responses of whole revisions of about decodeChunk
// changes, not in etcd's responses of up to 1,000 revisions, and that a put
// of a version the cache holds is not read again but handed over as the
// cache's object.
func TestEtcdChangesChunksAndHeld(t *testing.T) {
	f := newEtcdChangesFixture(t)
	ctx := context.Background()
	// 20 revisions of 120 puts (etcd's bound is 128 a transaction): 2,400
	// changes, which etcd sends at once to a watch from before them, in
	// fragments of its request limit (1.5 MiB): each pod carries 1 KiB,
	// 2.6 MB in all, which etcd's client joins again.
	const perRev, revs = 120, 20
	payload := strings.Repeat("x", 1024)
	var first int64
	for r := range revs {
		var ops []clientv3.Op
		for i := range perRev {
			name := fmt.Sprintf("p%02d-%03d", r, i)
			pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: map[string]string{"payload": payload}}}
			ops = append(ops, clientv3.OpPut(etcdKey(name), f.storedPod(t, pod)))
		}
		resp, err := f.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if first == 0 {
			first = resp.Header.Revision
		}
	}
	// The cache holds every object of the second revision at its version.
	heldRev := uint64(first + 1)
	held := &object.Object{Key: "held"}
	var decoded atomic.Int64
	cfg := f.changes.cfg
	decode := cfg.Decode
	cfg.Decode = func(data []byte, rev uint64) (runtime.Object, error) {
		decoded.Add(1)
		return decode(data, rev)
	}
	cfg.Held = func(key string, rev uint64) *object.Object {
		if rev == heldRev {
			return held
		}
		return nil
	}
	s := NewEtcdChanges(cfg).Watch(ctx, uint64(first-1))
	defer s.Close()
	var sizes []int
	var lastRev uint64
	for got := 0; got < perRev*revs; {
		r := next(t, s)
		if r.End != nil {
			t.Fatalf("the watch ended: %v", r.End)
		}
		if len(r.Changes) == 0 {
			continue
		}
		if r.Changes[0].Rev == lastRev {
			t.Fatalf("revision %d split across Responses", lastRev)
		}
		sizes = append(sizes, len(r.Changes))
		got += len(r.Changes)
		lastRev = r.Changes[len(r.Changes)-1].Rev
		for _, ch := range r.Changes {
			switch {
			case ch.Rev == heldRev && (ch.Held != held || ch.Object != nil):
				t.Fatalf("a put the cache holds: Held %p, Object %v; want the cache's object %p and nothing read", ch.Held, ch.Object, held)
			case ch.Rev != heldRev && (ch.Held != nil || ch.Object == nil):
				t.Fatalf("a put the cache does not hold: Held %p, Object %v; want it read", ch.Held, ch.Object)
			}
		}
	}
	// 1,000 changes end inside a revision: each Response takes the rest of it.
	if want := []int{1080, 1080, 240}; !slices.Equal(sizes, want) {
		t.Errorf("Responses of %v changes; want %v (whole revisions, at least %d but the last)", sizes, want, decodeChunk)
	}
	if n, want := decoded.Load(), int64(perRev*(revs-1)); n != want {
		t.Errorf("decoded %d values; want %d: the held revision's puts are not read", n, want)
	}
}
