package corpus

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// agentLabels are the labels an Agent may carry, as a node's.
var agentLabels = []label{
	{"kubernetes.io/arch", func(g *Generator) string { return g.pick([]string{"amd64", "amd64", "arm64"}) }},
	{"kubernetes.io/os", func(*Generator) string { return "linux" }},
	{"topology.kubernetes.io/region", func(g *Generator) string { return g.pick(regions) }},
	{"node.kubernetes.io/instance-type", func(g *Generator) string { return g.pick(instanceTypes) }},
	{"fleet.example.com/pool", func(g *Generator) string { return g.pick(pools) }},
	{"fleet.example.com/cluster", func(g *Generator) string { return g.pick(clusters) }},
	{"team", func(g *Generator) string { return g.pick(teams) }},
	{"env", func(g *Generator) string { return g.pick(envs) }},
	{"app.kubernetes.io/managed-by", func(g *Generator) string { return g.pick(managedBy) }},
}

// Agent returns the next Agent: named as a cloud's nodes are, with a zone,
// labels, a few annotations, and the conditions its agent reports.
func (g *Generator) Agent() *v1beta1.Agent {
	g.tick()
	region := g.pick(regions)
	zone := region + g.pick(zoneLetters)
	var name string
	switch g.rng.IntN(3) {
	case 0:
		name = fmt.Sprintf("ip-10-%d-%d-%d.%s.compute.internal", g.rng.IntN(256), g.rng.IntN(256), g.rng.IntN(256), region)
	case 1:
		name = fmt.Sprintf("gke-%s-%s-%s-%s", g.pick(clusters), g.pick(pools), g.hex(8), g.suffix(4))
	default:
		name = fmt.Sprintf("agent-%s-%s", zone, g.suffix(5))
	}
	created := g.now.Add(-g.age())
	a := &v1beta1.Agent{
		ObjectMeta: g.meta(name, "", g.now.Sub(created)),
		Spec:       v1beta1.AgentSpec{Zone: zone, Capacity: int32(g.pickInt(8, 16, 32, 64))},
	}
	a.Labels = g.labels(agentLabels, 2, 5)
	a.Labels["topology.kubernetes.io/zone"] = zone
	a.Annotations = g.agentAnnotations(name)

	applied := g.chance(0.25) // registered by hand or by a GitOps tool, not by the agent
	creatorLabels, controllerLabels := g.split(a.Labels, 0.3)
	if applied {
		a.Annotations[lastAppliedKey] = lastApplied("Agent", metav1.ObjectMeta{Name: name, Labels: creatorLabels, Annotations: copyWithout(a.Annotations, lastAppliedKey)}, a.Spec)
	}

	// Status: each condition once, Ready always, the rare state one time in
	// twenty; the agent heartbeats every few seconds.
	for i, c := range g.rng.Perm(len(agentConditions))[:g.between(1, 3)] {
		if i == 0 {
			c = 0 // Ready
		} else if c == 0 {
			continue
		}
		def := agentConditions[c]
		cond := metav1.Condition{Type: def.kind, Status: metav1.ConditionStatus(def.status), Reason: def.reason,
			Message: def.message, ObservedGeneration: a.Generation, LastTransitionTime: g.since(created)}
		if g.chance(0.05) {
			cond.Status, cond.Reason = metav1.ConditionStatus(def.rareStatus), def.rareReason
			cond.Message = g.sentence(def.rareMessage)
		}
		a.Status.Conditions = append(a.Status.Conditions, cond)
	}
	beat := metav1.NewTime(g.now.Add(-time.Duration(g.rng.IntN(30)) * time.Second))
	a.Status.LastHeartbeatTime = &beat

	// Managers: who created it, the agent for its status, and for three in
	// ten a labelling controller.
	creator := fieldSet{}.addMap(true, creatorLabels, "f:metadata", "f:labels").
		addMap(true, a.Annotations, "f:metadata", "f:annotations").
		add("f:spec", "f:zone").add("f:spec", "f:capacity")
	creatorName, op := "fleet-agent", metav1.ManagedFieldsOperationUpdate
	if applied {
		creatorName = "kubectl-client-side-apply"
	} else if g.chance(0.3) {
		creatorName, op = "argocd-controller", metav1.ManagedFieldsOperationApply
	}
	a.ManagedFields = append(a.ManagedFields, creator.entry(creatorName, op, "", metav1.NewTime(created.Truncate(time.Second))))
	status := fieldSet{}.add("f:status", "f:lastHeartbeatTime")
	for _, c := range a.Status.Conditions {
		k := fmt.Sprintf(`k:{"type":%q}`, c.Type)
		for _, f := range []string{".", "f:lastTransitionTime", "f:message", "f:observedGeneration", "f:reason", "f:status", "f:type"} {
			status.add("f:status", "f:conditions", k, f)
		}
	}
	a.ManagedFields = append(a.ManagedFields, status.entry("fleet-agent", metav1.ManagedFieldsOperationUpdate, "status", beat))
	if controllerLabels != nil {
		a.ManagedFields = append(a.ManagedFields, fieldSet{}.addMap(false, controllerLabels, "f:metadata", "f:labels").
			entry("fleet-labeler", metav1.ManagedFieldsOperationUpdate, "", g.since(created)))
	}
	return a
}

// agentAnnotations returns an Agent's one to three annotations, and one
// time in ten its client certificate.
func (g *Generator) agentAnnotations(name string) map[string]string {
	pool := []func() (string, string){
		func() (string, string) { return "fleet.example.com/agent-version", g.pick(versions) },
		func() (string, string) {
			return "fleet.example.com/registered-by", "system:serviceaccount:kube-fleet:fleet-bootstrap-" + g.suffix(5)
		},
		func() (string, string) {
			return "fleet.example.com/description", g.sentence(g.pick(descriptions), queues, teams, owners)
		},
		func() (string, string) {
			return "fleet.example.com/heartbeat-endpoint", fmt.Sprintf("https://%s:10250/healthz", name)
		},
	}
	out := map[string]string{}
	for _, i := range g.rng.Perm(len(pool))[:g.few()] {
		k, v := pool[i]()
		out[k] = v
	}
	if g.chance(0.1) {
		out["fleet.example.com/client-certificate"] = g.secret()
	}
	return out
}

// pickInt returns one of the values.
func (g *Generator) pickInt(values ...int) int { return values[g.rng.IntN(len(values))] }

// copyWithout returns m without key, nil if nothing is left.
func copyWithout(m map[string]string, key string) map[string]string {
	var out map[string]string
	for k, v := range m {
		if k == key {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}
