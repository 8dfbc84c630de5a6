package source

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
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

// TestEtcdRanges reads ranges of pods' keys, and all their keys, from a
// real etcd, as a stream and as pages from an etcd without RangeStream:
// each range holds exactly its keys at the revision asked, up to its end
// or the resource's and no further, with every value read through the
// transformer as it was at that revision; a compacted revision is
// ResourceExpired, as the etcd3 store's list says; an error of fn ends the
// read with it.
func TestEtcdRanges(t *testing.T) {
	f := newEtcdChangesFixture(t)
	ctx := context.Background()
	for i := range 10 {
		if _, err := f.cli.Put(ctx, etcdKey(fmt.Sprintf("p%d", i)), f.stored(t, fmt.Sprintf("p%d", i))); err != nil {
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
	// p3 changes, and p4 goes, after rev: reads at rev see them as they were.
	if _, err := f.cli.Put(ctx, etcdKey("p3"), f.stored(t, "p3")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.Delete(ctx, etcdKey("p4")); err != nil {
		t.Fatal(err)
	}

	noStream := &noRangeStream{}
	paged, err := clientv3.New(clientv3.Config{Endpoints: f.cli.Endpoints(), Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(noStream.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = paged.Close() })

	for _, tc := range []struct {
		name   string
		client *clientv3.Client
	}{
		{name: "streamed", client: f.cli},
		{name: "paged, without RangeStream", client: paged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranges := NewEtcdRanges(EtcdRangesConfig{Client: tc.client, StoragePrefix: "/registry", ResourcePrefix: "/pods",
				Transformer: prefixTransformer{}, Decode: f.changes.cfg.Decode})
			keys := NewEtcdKeyReader(tc.client, "/registry", "/pods")
			ranges.pageSize, keys.pageSize = 3, 3
			streamsBefore := noStream.streams.Load()
			for _, r := range []struct {
				from, to string
				want     []string
			}{
				{from: "/pods/ns/p2", to: "/pods/ns/p7", want: []string{"p2", "p3", "p4", "p5", "p6"}},
				{from: "/pods/ns/p0", to: "/pods/ns/p1", want: []string{"p0"}},
				{from: "/pods/ns/p6", want: []string{"p6", "p7", "p8", "p9"}},
				{from: "/pods/", want: []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"}},
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
			if len(got) != 10 || got[0] != "/pods/ns/p0" || got[9] != "/pods/ns/p9" {
				t.Errorf("keys at %d: %v, want p0 to p9", rev, got)
			}

			stop := errors.New("stop")
			calls := 0
			err := ranges.ReadRange(ctx, rev, "/pods/", "", func(string, int64, func() (runtime.Object, error)) error {
				calls++
				return stop
			})
			if !errors.Is(err, stop) || calls != 1 {
				t.Errorf("fn's error: %v after %d calls, want it after 1", err, calls)
			}
			if tc.client == paged && noStream.streams.Load() == streamsBefore {
				t.Error("no RangeStream was tried before the pages")
			}
		})
	}

	if _, err := f.cli.Compact(ctx, rev+1); err != nil {
		t.Fatal(err)
	}
	ranges := NewEtcdRanges(EtcdRangesConfig{Client: f.cli, StoragePrefix: "/registry", ResourcePrefix: "/pods", Decode: f.changes.cfg.Decode})
	err = ranges.ReadRange(ctx, rev, "/pods/", "", func(string, int64, func() (runtime.Object, error)) error { return nil })
	if !apierrors.IsResourceExpired(err) {
		t.Errorf("a compacted revision: %v, want ResourceExpired", err)
	}
}
