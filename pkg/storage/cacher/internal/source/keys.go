package source

import (
	"context"
	"path"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/protobuf/proto"
	"k8s.io/apiserver/pkg/audit"
	"k8s.io/apiserver/pkg/storage/etcd3/metrics"
	"k8s.io/component-base/tracing"
)

// KeyReader reads what etcd holds for the resource at a revision: keys and
// the revisions they were last modified at, never values. The consistency
// check compares the cache with it.
type KeyReader interface {
	// ReadKeys calls fn in key order for every key of the resource at rev,
	// with its modification revision, and returns how many bytes etcd sent.
	ReadKeys(ctx context.Context, rev int64, fn func(key string, modRev int64)) (bytes int64, err error)
}

// keyReaderPageSize is how many keys one etcd range request returns from an
// etcd without RangeStream (readPages). At about 100 bytes a key a page
// stays near 1 MiB.
const keyReaderPageSize = 10000

// EtcdKeyReader is a KeyReader over an etcd client, reading keys only, at
// one revision.
type EtcdKeyReader struct {
	client *clientv3.Client
	prefix etcdPrefix
	// pageSize is readPages' page: keyReaderPageSize but in tests.
	pageSize int64
}

var _ KeyReader = &EtcdKeyReader{}

// NewEtcdKeyReader reads the keys the etcd3 store built with storagePrefix
// (storagebackend.Config.Prefix) keeps for resourcePrefix.
func NewEtcdKeyReader(client *clientv3.Client, storagePrefix, resourcePrefix string) *EtcdKeyReader {
	return &EtcdKeyReader{client: client, prefix: newEtcdPrefix(storagePrefix, resourcePrefix), pageSize: keyReaderPageSize}
}

// etcdPrefix is where the etcd3 store keeps a resource's keys.
type etcdPrefix struct {
	// pathPrefix is the etcd3 store's prefix, ending in "/": the store keeps
	// key /k at pathPrefix + "k".
	pathPrefix string
	// rangePrefix is the resource's keys' prefix in etcd.
	rangePrefix string
}

// newEtcdPrefix places the keys of resourcePrefix as the etcd3 store built
// with storagePrefix does (etcd3.New and its prepareKey).
func newEtcdPrefix(storagePrefix, resourcePrefix string) etcdPrefix {
	pathPrefix := path.Join("/", storagePrefix)
	if !strings.HasSuffix(pathPrefix, "/") {
		pathPrefix += "/"
	}
	rangePrefix := pathPrefix + strings.TrimPrefix(resourcePrefix, "/")
	if !strings.HasSuffix(rangePrefix, "/") {
		rangePrefix += "/"
	}
	return etcdPrefix{pathPrefix: pathPrefix, rangePrefix: rangePrefix}
}

// etcdKey is the etcd key of a storage key: cacheKey's inverse.
func (p etcdPrefix) etcdKey(cacheKey string) string {
	return p.pathPrefix + strings.TrimPrefix(cacheKey, "/")
}

// cacheKey is the storage key of an etcd key.
func (p etcdPrefix) cacheKey(etcdKey []byte) string {
	return "/" + strings.TrimPrefix(string(etcdKey), p.pathPrefix)
}

// ReadKeys implements KeyReader, as one stream (streamRange).
func (r *EtcdKeyReader) ReadKeys(ctx context.Context, rev int64, fn func(key string, modRev int64)) (int64, error) {
	var bytes int64
	_, err := streamRange(ctx, r.client, r.prefix.rangePrefix, clientv3.GetPrefixRangeEnd(r.prefix.rangePrefix), rev, true, r.pageSize,
		func(kvs []*mvccpb.KeyValue) error {
			for _, kv := range kvs {
				bytes += int64(proto.Size(kv))
				fn(r.prefix.cacheKey(kv.Key), kv.ModRevision)
			}
			return nil
		})
	return bytes, err
}

// readKeys reads the keys with Config.Keys, and reports the read to the
// etcd3 store's metrics and traces as the store reports its reads of keys
// only (listOnlyKeys), whatever KeyReader it is: every one reads etcd.
// A read the cache ended is no failure of etcd's.
func (s *Source) readKeys(ctx context.Context, rev int64, fn func(key string, modRev int64)) (int64, error) {
	ctx, span := tracing.Start(ctx, "List(recursive=true, keysOnly=true) etcd3", attribute.String("audit-id", audit.GetAuditIDTruncated(ctx)),
		attribute.String("key", s.cfg.ResourcePrefix), attribute.Int64("resourceVersion", rev))
	defer span.End(500 * time.Millisecond)
	start := time.Now()
	n, err := s.cfg.Keys.ReadKeys(ctx, rev, fn)
	etcdErr := err
	if ctx.Err() != nil {
		etcdErr = nil
	}
	metrics.RecordEtcdRequest("listOnlyKeys", s.cfg.GroupResource, etcdErr, start)
	if err != nil {
		span.AddEvent("List call failed", attribute.String("err", err.Error()))
	}
	return n, err
}
