package source

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	storagevalue "k8s.io/apiserver/pkg/storage/value"
)

// noRangeStream makes a client's RangeStreams fail as an etcd without
// them (before 3.7) fails them: on the stream's first receive.
type noRangeStream struct{ streams atomic.Int64 }

func (n *noRangeStream) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || !strings.HasSuffix(method, "/RangeStream") {
		return s, err
	}
	n.streams.Add(1)
	return unimplementedStream{s}, nil
}

type unimplementedStream struct{ grpc.ClientStream }

func (unimplementedStream) RecvMsg(any) error {
	return grpcstatus.Error(grpccodes.Unimplemented, "unknown method RangeStream for service etcdserverpb.KV")
}

// rangeCalls counts a client's unary Range calls.
type rangeCalls struct{ n atomic.Int64 }

func (r *rangeCalls) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if strings.HasSuffix(method, "/Range") {
		r.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// streamGoroutines counts the goroutines etcd's client runs to feed a
// RangeStream's channel.
func streamGoroutines() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:goruntime.Stack(buf, true)]), "(*kv).GetStream.func1")
}

// client is another client of f's etcd, with opts.
func (f *etcdChangesFixture) client(t *testing.T, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: f.cli.Endpoints(), Logger: zap.NewNop(), DialOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestEtcdRanges reads ranges of 40 pods' keys, and all their keys, from a
// real etcd, as streams (of several chunks, without one unary Range) and
// as pages from an etcd without RangeStream: each range holds exactly its
// keys at the revision asked, up to its end or the resource's and no
// further, with every value read through the transformer as it was at that
// revision; a compacted revision is ResourceExpired, as the etcd3 store's
// list says; an error of fn ends the read with it, and leaves no goroutine
// of etcd's client behind.
func TestEtcdRanges(t *testing.T) {
	f := newEtcdChangesFixture(t)
	ctx := context.Background()
	const pods = 40
	name := func(i int) string { return fmt.Sprintf("p%02d", i) }
	for i := range pods {
		if _, err := f.cli.Put(ctx, etcdKey(name(i)), f.stored(t, name(i))); err != nil {
			t.Fatal(err)
		}
	}
	// Past the resource's end, and read by no range of it.
	if _, err := f.cli.Put(ctx, "/registry/pods0/x", "not a pod"); err != nil {
		t.Fatal(err)
	}
	at, err := f.cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	rev := at.Header.Revision
	// p03 changes, and p04 goes, after rev: reads at rev see them as they were.
	if _, err := f.cli.Put(ctx, etcdKey("p03"), f.stored(t, "p03")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.Delete(ctx, etcdKey("p04")); err != nil {
		t.Fatal(err)
	}

	unary, noStream := &rangeCalls{}, &noRangeStream{}
	streamed := f.client(t, grpc.WithUnaryInterceptor(unary.intercept))
	paged := f.client(t, grpc.WithStreamInterceptor(noStream.intercept))

	names := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, name(i))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		client *clientv3.Client
	}{
		{name: "streamed", client: streamed},
		{name: "paged, without RangeStream", client: paged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranges := NewEtcdRanges(EtcdReadConfig{Client: tc.client, StoragePrefix: "/registry", ResourcePrefix: "/pods",
				Transformer: prefixTransformer{}, Decode: f.changes.cfg.Decode})
			keys := NewEtcdKeyReader(tc.client, "/registry", "/pods")
			ranges.pageSize, keys.pageSize = 3, 3
			unaryBefore, streamsBefore := unary.n.Load(), noStream.streams.Load()
			for _, r := range []struct {
				from, to string
				want     []string
			}{
				{from: "/pods/ns/p02", to: "/pods/ns/p07", want: names(2, 7)},
				{from: "/pods/ns/p00", to: "/pods/ns/p01", want: names(0, 1)},
				{from: "/pods/ns/p06", want: names(6, pods)},
				{from: "/pods/", want: names(0, pods)},
			} {
				var got []string
				err := ranges.ReadRange(ctx, rev, r.from, r.to, func(key string, modRev int64, read func() (runtime.Object, error)) error {
					obj, err := read()
					if err != nil {
						return err
					}
					m, err := meta.Accessor(obj)
					if err != nil {
						return err
					}
					if key != "/pods/ns/"+m.GetName() || m.GetResourceVersion() != fmt.Sprint(modRev) || modRev > rev {
						return fmt.Errorf("key %s at %d read as %s@%s", key, modRev, m.GetName(), m.GetResourceVersion())
					}
					got = append(got, m.GetName())
					return nil
				})
				if err != nil {
					t.Fatalf("[%s, %s): %v", r.from, r.to, err)
				}
				if fmt.Sprint(got) != fmt.Sprint(r.want) {
					t.Errorf("[%s, %s) at %d: %v, want %v", r.from, r.to, rev, got, r.want)
				}
			}
			var got []string
			if _, err := keys.ReadKeys(ctx, rev, func(key string, _ int64) { got = append(got, key) }); err != nil {
				t.Fatal(err)
			}
			if len(got) != pods || got[0] != "/pods/ns/p00" || got[pods-1] != "/pods/ns/"+name(pods-1) {
				t.Errorf("keys at %d: %v, want p00 to %s", rev, got, name(pods-1))
			}

			stop := errors.New("stop")
			for i := range 5 {
				calls := 0
				err := ranges.ReadRange(ctx, rev, "/pods/", "", func(string, int64, func() (runtime.Object, error)) error {
					if calls++; calls == 1+i*7 {
						return stop
					}
					return nil
				})
				if !errors.Is(err, stop) || calls != 1+i*7 {
					t.Errorf("fn's error after %d calls: %v after %d calls", 1+i*7, err, calls)
				}
			}
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
				return streamGoroutines() == 0, nil
			}); err != nil {
				t.Errorf("%d goroutines of etcd's client still feed a stream that ended", streamGoroutines())
			}
			if tc.client == streamed && unary.n.Load() != unaryBefore {
				t.Errorf("%d unary Range calls, want every read streamed", unary.n.Load()-unaryBefore)
			}
			if tc.client == paged && noStream.streams.Load() == streamsBefore {
				t.Error("no RangeStream was tried before the pages")
			}
		})
	}

	if _, err := f.cli.Compact(ctx, rev+1); err != nil {
		t.Fatal(err)
	}
	for _, client := range []*clientv3.Client{streamed, paged} {
		ranges := NewEtcdRanges(EtcdReadConfig{Client: client, StoragePrefix: "/registry", ResourcePrefix: "/pods", Decode: f.changes.cfg.Decode})
		err = ranges.ReadRange(ctx, rev, "/pods/", "", func(string, int64, func() (runtime.Object, error)) error { return nil })
		if !apierrors.IsResourceExpired(err) {
			t.Errorf("a compacted revision: %v, want ResourceExpired", err)
		}
		_, err = NewEtcdKeyReader(client, "/registry", "/pods").ReadKeys(ctx, rev, func(string, int64) {})
		if !apierrors.IsResourceExpired(err) {
			t.Errorf("the keys at a compacted revision: %v, want ResourceExpired", err)
		}
	}
}

// TestEtcdRangesReadErrors reads a value the transformer refuses, as a KMS
// plugin that does not answer would make it, and one that does not
// decode: only the first is a transformError, which a list retries, where
// the second is unreadable for good.
func TestEtcdRangesReadErrors(t *testing.T) {
	f := newEtcdChangesFixture(t)
	ctx := context.Background()
	if _, err := f.cli.Put(ctx, etcdKey("refused"), "not transformed"); err != nil {
		t.Fatal(err)
	}
	garbage, _ := prefixTransformer{}.TransformToStorage(ctx, []byte("{not json"), storagevalue.DefaultContext(etcdKey("undecodable")))
	resp, err := f.cli.Put(ctx, etcdKey("undecodable"), string(garbage))
	if err != nil {
		t.Fatal(err)
	}
	ranges := NewEtcdRanges(EtcdReadConfig{Client: f.cli, StoragePrefix: "/registry", ResourcePrefix: "/pods",
		Transformer: prefixTransformer{}, Decode: f.changes.cfg.Decode})
	got := map[string]bool{}
	err = ranges.ReadRange(ctx, resp.Header.Revision, "/pods/", "", func(key string, _ int64, read func() (runtime.Object, error)) error {
		_, err := read()
		if err == nil {
			return fmt.Errorf("%s read", key)
		}
		got[key] = errors.As(err, new(transformError))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]bool{"/pods/ns/refused": true, "/pods/ns/undecodable": false}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("transform errors by key: %v, want %v", got, want)
	}
}
