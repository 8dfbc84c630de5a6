package source

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage/etcd3/metrics"
)

// EtcdRevision reads etcd's current revision through the cache's own etcd
// client, the one its watch follows etcd on, as the etcd3 store's
// GetCurrentResourceVersion does through the store's: a linearizable
// read of one key of the resource's, which never holds an object.
//
// A consistent read waits until the cache holds the revision it reads,
// which only the cache's watch brings: reading it through the store's
// client made such reads depend on two connections. After a member's
// restart the store's client reconnected up to 9 s after the cache's own,
// and every consistent read failed meanwhile while the cache was current.
type EtcdRevision struct {
	client   *clientv3.Client
	key      string
	resource schema.GroupResource
}

// NewEtcdRevision reads the revision of the etcd that the etcd3 store
// built with storagePrefix keeps resource's keys, under resourcePrefix, in.
func NewEtcdRevision(client *clientv3.Client, storagePrefix, resourcePrefix string, resource schema.GroupResource) *EtcdRevision {
	return &EtcdRevision{client: client, key: newEtcdPrefix(storagePrefix, resourcePrefix).rangePrefix, resource: resource}
}

// Current returns etcd's current revision. It is counted, as the etcd3
// store counts its own read, in etcd_request_duration_seconds and
// etcd_requests_total as getCurrentResourceVersion.
func (r *EtcdRevision) Current(ctx context.Context) (uint64, error) {
	start := time.Now()
	resp, err := r.client.Get(ctx, r.key, clientv3.WithCountOnly())
	metrics.RecordEtcdRequest("getCurrentResourceVersion", r.resource, err, start)
	if err != nil {
		return 0, err
	}
	if resp.Header.Revision <= 0 {
		return 0, errors.New("etcd answered with no revision")
	}
	return uint64(resp.Header.Revision), nil
}
