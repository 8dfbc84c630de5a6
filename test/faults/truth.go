package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// Where the servers keep the two resources in etcd.
const (
	etcdPrefix       = "/registry/fleet.example.com/assignments/"
	agentsEtcdPrefix = "/registry/fleet.example.com/agents/"
)

// objState is what the invariants need of one version of an assignment or
// an agent: what selectors read.
type objState struct {
	namespace, name string
	labels          map[string]string
	// agent and phase are an assignment's, zone an agent's.
	agent, phase, zone string
}

// truth is the ground truth of one resource: etcd's own history of it,
// from a direct watch with previous values, as etcd's robustness tests take
// it. Every stream and list the servers hand out is checked against it.
type truth = watchcheck.History[objState]

// startTruth reads the state of the resource under prefix at the current
// revision and watches every change after it until ctx ends. Its keys are
// the harness's: namespace/name, or the name of a cluster-scoped object.
func startTruth(ctx context.Context, client *clientv3.Client, prefix string) (*truth, error) {
	return watchcheck.Follow(ctx, client, prefix, func(k string) string { return strings.TrimPrefix(k, prefix) }, decodeState)
}

// stored is what decodeState reads of an assignment or an agent.
type stored struct {
	Metadata struct {
		Name, Namespace string
		Labels          map[string]string
	}
	Spec struct {
		AgentName string `json:"agentName"`
		Zone      string `json:"zone"`
	}
	Status struct {
		Phase string `json:"phase"`
	}
}

func decodeState(key string, value []byte, rev int64) (*objState, error) {
	var s stored
	if err := json.Unmarshal(value, &s); err != nil {
		return nil, fmt.Errorf("decoding %s at %d: %w", key, rev, err)
	}
	return &objState{namespace: s.Metadata.Namespace, name: s.Metadata.Name, labels: s.Metadata.Labels,
		agent: s.Spec.AgentName, phase: s.Status.Phase, zone: s.Spec.Zone}, nil
}
