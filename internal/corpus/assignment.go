package corpus

import (
	"fmt"
	"math"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

// assignmentLabels are the labels an Assignment may carry, as a workload's.
// app.kubernetes.io/name is always one of them.
var assignmentLabels = []label{
	{"app.kubernetes.io/instance", func(g *Generator) string { return g.pick(apps) + "-" + g.pick(envs) }},
	{"app.kubernetes.io/version", func(g *Generator) string { return g.pick(versions) }},
	{"app.kubernetes.io/component", func(g *Generator) string { return g.pick(components) }},
	{"app.kubernetes.io/part-of", func(g *Generator) string { return g.pick(partOf) }},
	{"app.kubernetes.io/managed-by", func(g *Generator) string { return g.pick(managedBy) }},
	{"fleet.example.com/queue", func(g *Generator) string { return g.pick(queues) }},
	{"team", func(g *Generator) string { return g.pick(teams) }},
	{"env", func(g *Generator) string { return g.pick(envs) }},
	{"tier", func(g *Generator) string { return g.pick(tiers) }},
	{"pod-template-hash", func(g *Generator) string { return g.hex(10) }},
}

// Assignment returns the next Assignment: a workload's name and labels, a
// job's configuration as its payload, and the phase it reached.
func (g *Generator) Assignment() *v1beta1.Assignment {
	g.tick()
	app := g.pick(apps)
	ns := g.pick(namespaces)
	name := fmt.Sprintf("%s-%s-%s", app, g.hex(g.between(8, 10)), g.suffix(5))
	created := g.now.Add(-g.age() / 8) // work is younger than the agents running it
	a := &v1beta1.Assignment{
		ObjectMeta: g.meta(name, ns, g.now.Sub(created)),
		Spec: v1beta1.AssignmentSpec{
			AgentName: g.agentName(),
			Payload:   g.payload(app, ns),
			Priority:  int32(g.pickInt(0, 0, 0, 100, 500, -100, 1000)),
		},
	}
	a.Labels = g.labels(assignmentLabels, 2, 5)
	a.Labels["app.kubernetes.io/name"] = app
	a.Annotations = g.assignmentAnnotations(app, ns)

	applied := g.chance(0.15)
	creatorLabels, controllerLabels := g.split(a.Labels, 0.25)
	if applied {
		a.Annotations[lastAppliedKey] = lastApplied("Assignment", metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: creatorLabels, Annotations: copyWithout(a.Annotations, lastAppliedKey)}, a.Spec)
	}

	a.Status = g.assignmentStatus(a)

	creator := fieldSet{}.addMap(true, creatorLabels, "f:metadata", "f:labels").
		addMap(true, a.Annotations, "f:metadata", "f:annotations").
		add("f:spec", ".").add("f:spec", "f:agentName").add("f:spec", "f:payload")
	if a.Spec.Priority != 0 {
		creator.add("f:spec", "f:priority")
	}
	creatorName, op := "fleet-scheduler", metav1.ManagedFieldsOperationUpdate
	switch {
	case applied:
		creatorName = "kubectl-client-side-apply"
	case g.chance(0.4):
		creatorName, op = g.pick([]string{"helm", "argocd-controller", "fleet-operator"}), metav1.ManagedFieldsOperationApply
	}
	a.ManagedFields = append(a.ManagedFields, creator.entry(creatorName, op, "", metav1.NewTime(created.Truncate(time.Second))))
	if a.Status.Phase != v1beta1.AssignmentPending && g.chance(0.3) {
		a.ManagedFields = append(a.ManagedFields, fieldSet{}.add("f:status", "f:message").add("f:status", "f:observedGeneration").
			add("f:status", "f:phase").entry("fleet-agent", metav1.ManagedFieldsOperationUpdate, "status", g.since(created)))
	}
	if controllerLabels != nil {
		a.ManagedFields = append(a.ManagedFields, fieldSet{}.addMap(false, controllerLabels, "f:metadata", "f:labels").
			entry("fleet-labeler", metav1.ManagedFieldsOperationUpdate, "", g.since(created)))
	}
	return a
}

// agentName returns the name of an Agent, as Agent draws them.
func (g *Generator) agentName() string {
	if g.chance(0.5) {
		return fmt.Sprintf("ip-10-%d-%d-%d.%s.compute.internal", g.rng.IntN(256), g.rng.IntN(256), g.rng.IntN(256), g.pick(regions))
	}
	return fmt.Sprintf("gke-%s-%s-%s-%s", g.pick(clusters), g.pick(pools), g.hex(8), g.suffix(4))
}

// assignmentAnnotations returns an Assignment's one to three annotations.
func (g *Generator) assignmentAnnotations(app, ns string) map[string]string {
	pool := []func() (string, string){
		func() (string, string) { return "fleet.example.com/owner", g.pick(owners) + "@example.com" },
		func() (string, string) {
			return "kubernetes.io/change-cause", g.sentence(g.pick(changeCauses), []string{ns}, []string{app}, versions)
		},
		func() (string, string) {
			return "fleet.example.com/description", g.sentence(g.pick(descriptions), queues, teams, owners)
		},
		func() (string, string) { return "fleet.example.com/revision", fmt.Sprint(g.between(1, 300)) },
		func() (string, string) { return "prometheus.io/scrape", "true" },
	}
	out := map[string]string{}
	for _, i := range g.rng.Perm(len(pool))[:g.few()] {
		k, v := pool[i]()
		out[k] = v
	}
	return out
}

// payload returns a job's configuration as YAML: an image pinned by
// digest, a command, environment, resources, and a list of inputs whose
// length has a long tail, which gives the corpus its tail of large
// objects. One time in ten it holds a certificate or a token.
// maxInputs bounds a payload's inputs.
const maxInputs = 50

func (g *Generator) payload(app, ns string) string {
	var b strings.Builder
	team := g.pick(teams)
	fmt.Fprintf(&b, "image: registry.example.com/%s/%s:%s", team, app, g.pick(versions))
	if g.chance(0.3) {
		fmt.Fprintf(&b, "@sha256:%s", g.hex(64))
	}
	b.WriteByte('\n')
	if g.chance(0.3) {
		fmt.Fprintf(&b, "command: [\"/usr/local/bin/%s\", \"--config=/etc/%s/config.yaml\"]\n", app, app)
	}
	if g.chance(0.15) {
		fmt.Fprintf(&b, "args:\n  - --queue=%s\n  - --concurrency=%d\n  - --log-level=%s\n", g.pick(queues), g.between(1, 64), g.pick(logLevels))
	}
	if g.chance(0.25) {
		b.WriteString("env:\n")
		fmt.Fprintf(&b, "  LOG_LEVEL: %s\n", g.pick(logLevels))
		if g.chance(0.5) {
			b.WriteString("  OTEL_EXPORTER_OTLP_ENDPOINT: http://otel-collector.monitoring.svc:4317\n")
		}
		if g.chance(0.5) {
			db := g.pick(databases)
			fmt.Fprintf(&b, "  DATABASE_URL: postgres://%s@%s.%s.svc:5432/%s?sslmode=require\n", app, db, ns, db)
		}
	}
	if g.chance(0.3) {
		fmt.Fprintf(&b, "resources: {cpu: %s, memory: %s}\n", g.pick(cpus), g.pick(memories))
	}
	if g.chance(0.4) {
		fmt.Fprintf(&b, "timeoutSeconds: %d\n", g.pickInt(60, 300, 600, 3600))
	}
	// Inputs: none for most, a long tail of many (median 0, one in a
	// hundred above about 45), up to what keeps the largest objects near
	// 10 KiB.
	inputs := int(math.Exp(g.rng.NormFloat64()*1.9 - 0.6))
	if inputs > 0 {
		b.WriteString("inputs:\n")
		for range min(inputs, maxInputs) {
			b.WriteString("  - ")
			b.WriteString(g.sentence(g.pick(hostsAndPaths), queues))
			b.WriteByte('\n')
		}
	}
	if g.chance(0.1) {
		if g.chance(0.5) {
			fmt.Fprintf(&b, "tls:\n  caBundle: %s\n", g.secret())
		} else {
			fmt.Fprintf(&b, "auth:\n  token: %s\n", g.secret())
		}
	}
	return b.String()
}

// assignmentStatus returns how far a's work went, and a message saying so.
func (g *Generator) assignmentStatus(a *v1beta1.Assignment) v1beta1.AssignmentStatus {
	s := v1beta1.AssignmentStatus{ObservedGeneration: a.Generation}
	switch r := g.rng.Float64(); {
	case r < 0.15:
		s.Phase = v1beta1.AssignmentPending
		s.Message = g.sentence(g.pick(pendingMessages), []string{a.Spec.AgentName}, pools)
	case r < 0.55:
		s.Phase = v1beta1.AssignmentRunning
		s.Message = g.sentence(g.pick(runningMessages), []string{a.Spec.AgentName})
	case r < 0.9:
		s.Phase = v1beta1.AssignmentSucceeded
		s.Message = g.sentence(g.pick(succeededMessages), []string{"s3://fleet-exports/" + a.Namespace + "/" + a.Name})
	default:
		s.Phase = v1beta1.AssignmentFailed
		s.Message = g.sentence(g.pick(failedMessages), []string{"registry.example.com/" + a.Labels["app.kubernetes.io/name"]})
	}
	return s
}
