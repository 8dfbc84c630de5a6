package agent

import (
	"context"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
)

func agent() *fleet.Agent {
	return &fleet.Agent{
		ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "1", Generation: 4},
		Spec:       fleet.AgentSpec{Zone: "z1", Capacity: 2},
		Status:     fleet.AgentStatus{Conditions: []metav1.Condition{{Type: fleet.AgentConditionReady, Status: metav1.ConditionTrue}}},
	}
}

// TestStrategies checks what the Agent kind tells the shared strategies:
// a create clears status, an update keeps it and bumps the generation only
// for a spec change, a status update keeps spec and generation.
func TestStrategies(t *testing.T) {
	s := Kind.Strategy(runtime.NewScheme())
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		prepare func(a, old *fleet.Agent)
		mutate  func(*fleet.Agent)
		check   func(t *testing.T, a, old *fleet.Agent)
	}{
		{name: "create clears status", prepare: func(a, _ *fleet.Agent) { s.PrepareForCreate(ctx, a) },
			check: func(t *testing.T, a, _ *fleet.Agent) {
				if a.Status.Conditions != nil || a.Generation != 1 {
					t.Errorf("status %+v, generation %d; want none, 1", a.Status, a.Generation)
				}
			}},
		{name: "spec change bumps generation", mutate: func(a *fleet.Agent) { a.Spec.Capacity = 9; a.Status = fleet.AgentStatus{} },
			prepare: func(a, old *fleet.Agent) { s.PrepareForUpdate(ctx, a, old) },
			check: func(t *testing.T, a, old *fleet.Agent) {
				if a.Generation != 5 || !reflect.DeepEqual(a.Status, old.Status) {
					t.Errorf("generation %d, status %+v; want 5, the stored status", a.Generation, a.Status)
				}
			}},
		{name: "label change keeps generation", mutate: func(a *fleet.Agent) { a.Labels = map[string]string{"k": "v"} },
			prepare: func(a, old *fleet.Agent) { s.PrepareForUpdate(ctx, a, old) },
			check: func(t *testing.T, a, _ *fleet.Agent) {
				if a.Generation != 4 {
					t.Errorf("generation %d, want 4", a.Generation)
				}
			}},
		{name: "status update keeps spec", mutate: func(a *fleet.Agent) { a.Spec.Zone = "z2"; a.Status.Conditions = nil },
			prepare: func(a, old *fleet.Agent) { s.Status().PrepareForUpdate(ctx, a, old) },
			check: func(t *testing.T, a, old *fleet.Agent) {
				if a.Spec != old.Spec || a.Generation != 4 || a.Status.Conditions != nil {
					t.Errorf("spec %+v, generation %d, conditions %v; want the stored spec, 4, none", a.Spec, a.Generation, a.Status.Conditions)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, a := agent(), agent()
			if tc.mutate != nil {
				tc.mutate(a)
			}
			tc.prepare(a, old)
			tc.check(t, a, old)
		})
	}
}

// TestSelectableFields checks that an Agent, cluster-scoped, has no
// metadata.namespace field.
func TestSelectableFields(t *testing.T) {
	want := fields.Set{"metadata.name": "a", "spec.zone": "z1"}
	if got := Kind.SelectableFields(agent()); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if Kind.Strategy(runtime.NewScheme()).NamespaceScoped() {
		t.Fatal("Agents are cluster-scoped")
	}
}
