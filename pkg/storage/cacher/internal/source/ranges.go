package source

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	grpccodes "google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/audit"
	"k8s.io/apiserver/pkg/storage/etcd3/metrics"
	storagevalue "k8s.io/apiserver/pkg/storage/value"
	"k8s.io/component-base/tracing"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
)

// RangeReader reads the objects etcd holds in a range of the resource's
// keys: listSplit reads its pages with it, each up to the first key of the
// next, where a page read through the etcd3 store runs to the end of the
// resource.
type RangeReader interface {
	// ReadRange calls fn in key order for each key of the resource from
	// from up to, not including, to ("" for the resource's end) at rev,
	// with the revision it was last modified at, and a read that decodes
	// its value as the etcd3 store's list would. A revision etcd compacted
	// is a ResourceExpired error, as the store's.
	ReadRange(ctx context.Context, rev int64, from, to string, fn func(key string, modRev int64, read func() (runtime.Object, error)) error) error
}

// EtcdReadConfig is what EtcdRanges and EtcdChanges read, and how.
type EtcdReadConfig struct {
	// Client is the etcd the etcd3 store writes to.
	Client *clientv3.Client
	// StoragePrefix (storagebackend.Config.Prefix) and ResourcePrefix place
	// the resource's keys, as the etcd3 store does.
	StoragePrefix, ResourcePrefix string
	// Transformer reads stored values, as the etcd3 store's (encryption at
	// rest); nil reads them as they are.
	Transformer storagevalue.Transformer
	// Decode decodes a value the Transformer read, and sets its
	// resourceVersion to rev.
	Decode func(data []byte, rev uint64) (runtime.Object, error)
	// GroupResource labels the etcd3 store's metrics the reads report to.
	GroupResource schema.GroupResource
}

func (c EtcdReadConfig) prefix() etcdPrefix { return newEtcdPrefix(c.StoragePrefix, c.ResourcePrefix) }

func (c EtcdReadConfig) values() etcdValues {
	return etcdValues{transformer: c.Transformer, decode: c.Decode, gr: c.GroupResource}
}

// EtcdRanges is a RangeReader over an etcd client.
type EtcdRanges struct {
	cfg    EtcdReadConfig
	prefix etcdPrefix
	values etcdValues
	// pageSize is readPages' page: keyReaderPageSize but in tests.
	pageSize int64
}

var _ RangeReader = &EtcdRanges{}

// NewEtcdRanges returns a RangeReader over cfg.
func NewEtcdRanges(cfg EtcdReadConfig) *EtcdRanges {
	return &EtcdRanges{cfg: cfg, prefix: cfg.prefix(), values: cfg.values(), pageSize: keyReaderPageSize}
}

// ReadRange implements RangeReader. It reports to the etcd3 store's
// metrics and traces as a streamed list of the store's would: a request
// (etcd_request_duration_seconds, verb listStream, or list on an etcd
// without RangeStream), the objects it read (apiserver_storage_list_*),
// its duration (apiserver_storage_list_duration_seconds), and a span.
func (r *EtcdRanges) ReadRange(ctx context.Context, rev int64, from, to string, fn func(key string, modRev int64, read func() (runtime.Object, error)) error) (err error) {
	if err := inject.Hit(ctx, inject.ListPageBefore); err != nil {
		return err
	}
	ctx, span := tracing.Start(ctx, "List(recursive=true) etcd3", attribute.String("audit-id", audit.GetAuditIDTruncated(ctx)),
		attribute.String("key", r.cfg.ResourcePrefix), attribute.Int64("resourceVersion", rev),
		attribute.String("from", from), attribute.String("to", to))
	defer span.End(500 * time.Millisecond)
	start, read := time.Now(), 0
	end := clientv3.GetPrefixRangeEnd(r.prefix.rangePrefix)
	if to != "" {
		end = r.prefix.etcdKey(to)
	}
	var fnErr error
	streamed, err := streamRange(ctx, r.cfg.Client, r.prefix.etcdKey(from), end, rev, false, r.pageSize, func(kvs []*mvccpb.KeyValue) error {
		read += len(kvs)
		for _, kv := range kvs {
			read := func() (runtime.Object, error) { return r.values.read(ctx, kv.Key, kv.Value, uint64(kv.ModRevision)) }
			if fnErr = fn(r.prefix.cacheKey(kv.Key), kv.ModRevision, read); fnErr != nil {
				return fnErr
			}
		}
		return nil
	})
	verb := "listStream"
	if !streamed {
		verb = "list" // the pages' requests, as one
	}
	// An object that does not decode, or a read the cache ended, is no
	// failure of etcd's.
	etcdErr := err
	if fnErr != nil || ctx.Err() != nil {
		etcdErr = nil
	}
	metrics.RecordEtcdRequest(verb, r.cfg.GroupResource, etcdErr, start)
	metrics.RecordStorageListMetrics(r.cfg.GroupResource, "", read, read, read)
	metrics.RecordListLatency(r.cfg.GroupResource, streamed, start)
	if err != nil {
		span.AddEvent("List call failed", attribute.String("err", err.Error()))
		return err
	}
	span.AddEvent("List call succeeded", attribute.Int("count", read))
	return inject.Hit(ctx, inject.ListPageAfter)
}

// etcdValues reads a stored value as the etcd3 store does: through its
// transformer (encryption at rest), if any, then decoded at a revision.
type etcdValues struct {
	transformer storagevalue.Transformer
	decode      func(data []byte, rev uint64) (runtime.Object, error)
	// gr labels apiserver_storage_decode_errors_total, which counts the
	// values that do not decode, as the etcd3 store's reads count them.
	gr schema.GroupResource
}

// read returns a transformError if the transformer fails: a KMS plugin
// that does not answer, which a later attempt may get past, unlike bytes
// that do not decode.
func (v etcdValues) read(ctx context.Context, key, data []byte, rev uint64) (runtime.Object, error) {
	if v.transformer != nil {
		var err error
		if data, _, err = v.transformer.TransformFromStorage(ctx, data, storagevalue.DefaultContext(key)); err != nil {
			return nil, transformError{err}
		}
	}
	obj, err := v.decode(data, rev)
	if err != nil {
		metrics.RecordDecodeError(v.gr)
	}
	return obj, err
}

// transformError is a value the transformer could not read.
type transformError struct{ err error }

func (e transformError) Error() string { return "reading a stored value: " + e.err.Error() }
func (e transformError) Unwrap() error { return e.err }

// streamRange calls fn, chunk after chunk, with the key-values etcd holds
// in [from, end) at rev, in key order, and keys only with keysOnly.
//
// It reads them as one RangeStream, which costs etcd the keys it returns.
// A range read with a limit costs etcd every key to the end of its range
// besides, which it counts to say how many remain (the etcd3 store's paged
// lists, and its streams with a limit, count them too): read as pages of
// 10,000, a million keys cost etcd 10.8 s of CPU without their values,
// and 15.2 s with them, against 0.98 s as one stream and 5.1 s streamed
// over each page's own range (BenchmarkEtcdRanges, docs/benchmarks.md). An etcd without
// RangeStream (before 3.7) is read in pages of pageSize. A revision etcd
// compacted is a ResourceExpired error, as the etcd3 store's list says.
// It tells whether it read the range as a stream.
func streamRange(ctx context.Context, client *clientv3.Client, from, end string, rev int64, keysOnly bool, pageSize int64, fn func([]*mvccpb.KeyValue) error) (streamed bool, err error) {
	streamed, err = streamRangeRaw(ctx, client, from, end, rev, keysOnly, pageSize, fn)
	if errors.Is(err, rpctypes.ErrCompacted) {
		return streamed, apierrors.NewResourceExpired(fmt.Sprintf("revision %d was compacted while the cache read it: %v", rev, err))
	}
	return streamed, err
}

// streamRangeRaw is streamRange without its errors' mapping.
func streamRangeRaw(ctx context.Context, client *clientv3.Client, from, end string, rev int64, keysOnly bool, pageSize int64, fn func([]*mvccpb.KeyValue) error) (bool, error) {
	opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithRev(rev)}
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.GetStream(ctx, from, opts...)
	if grpcstatus.Code(err) == grpccodes.Unimplemented {
		return false, readPages(ctx, client, from, append(opts, clientv3.WithLimit(pageSize)), fn)
	}
	if err != nil {
		return true, err
	}
	// The client's goroutine sends on stream until the stream ends, which
	// cancel makes it do: it must be drained, or it stays blocked.
	defer func() {
		cancel()
		for range stream {
		}
	}()
	first, ended := true, false
	for resp := range stream {
		if err := resp.Err(); err != nil {
			if first && grpcstatus.Code(err) == grpccodes.Unimplemented {
				return false, readPages(ctx, client, from, append(opts, clientv3.WithLimit(pageSize)), fn)
			}
			return true, err
		}
		first = false
		// Only the last chunk has a header.
		ended = resp.Header != nil
		if err := fn(resp.Kvs); err != nil {
			return true, err
		}
	}
	if !ended {
		// As the etcd3 store's streamed list: a stream cut short by
		// something between us and etcd is not the whole range.
		return true, fmt.Errorf("%w: [%q, %q) at revision %d", errStreamCut, from, end, rev)
	}
	return true, nil
}

// errStreamCut is a range stream that ended before its last chunk.
var errStreamCut = errors.New("etcd's range stream ended before its last chunk")

// readPages is streamRange's reading on an etcd without RangeStream, with
// opts' limit as its pages' size.
func readPages(ctx context.Context, client *clientv3.Client, from string, opts []clientv3.OpOption, fn func([]*mvccpb.KeyValue) error) error {
	for {
		resp, err := client.Get(ctx, from, opts...)
		if err != nil {
			return err
		}
		if err := fn(resp.Kvs); err != nil {
			return err
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
