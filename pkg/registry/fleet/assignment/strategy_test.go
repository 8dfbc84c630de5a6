package assignment

import (
	"context"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
)

func assignment() *fleet.Assignment {
	return &fleet.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", ResourceVersion: "1", Generation: 4},
		Spec:       fleet.AssignmentSpec{AgentName: "agent-1", Priority: 1},
		Status:     fleet.AssignmentStatus{Phase: fleet.AssignmentRunning, ObservedGeneration: 4},
	}
}

func TestPrepareForCreate(t *testing.T) {
	a := assignment()
	a.Status.Message = "set by the client"
	Kind.Strategy(runtime.NewScheme()).PrepareForCreate(context.Background(), a)
	if a.Status != (fleet.AssignmentStatus{Phase: fleet.AssignmentPending}) {
		t.Errorf("create must clear status and default the phase, got %+v", a.Status)
	}
	if a.Generation != 1 {
		t.Errorf("generation = %d, want 1", a.Generation)
	}
}

func TestPrepareForUpdate(t *testing.T) {
	s := Kind.Strategy(runtime.NewScheme())
	tests := []struct {
		name           string
		mutate         func(*fleet.Assignment)
		wantGeneration int64
		wantStatus     fleet.AssignmentPhase
	}{
		{name: "spec change bumps generation", mutate: func(a *fleet.Assignment) { a.Spec.Priority = 9 }, wantGeneration: 5, wantStatus: fleet.AssignmentRunning},
		{name: "label change keeps generation", mutate: func(a *fleet.Assignment) { a.Labels = map[string]string{"k": "v"} }, wantGeneration: 4, wantStatus: fleet.AssignmentRunning},
		{name: "status is ignored", mutate: func(a *fleet.Assignment) { a.Status.Phase = fleet.AssignmentFailed }, wantGeneration: 4, wantStatus: fleet.AssignmentRunning},
		{name: "client cannot set generation", mutate: func(a *fleet.Assignment) { a.Generation = 100 }, wantGeneration: 4, wantStatus: fleet.AssignmentRunning},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old, a := assignment(), assignment()
			tc.mutate(a)
			s.PrepareForUpdate(context.Background(), a, old)
			if a.Generation != tc.wantGeneration || a.Status.Phase != tc.wantStatus {
				t.Fatalf("generation=%d phase=%s, want %d %s", a.Generation, a.Status.Phase, tc.wantGeneration, tc.wantStatus)
			}
		})
	}
}

func TestStatusStrategy(t *testing.T) {
	s := Kind.Strategy(runtime.NewScheme()).Status()
	old, a := assignment(), assignment()
	a.Spec.Priority = 500
	a.Spec.AgentName = "someone-else"
	a.Status.Phase = fleet.AssignmentSucceeded
	s.PrepareForUpdate(context.Background(), a, old)
	if a.Spec != old.Spec {
		t.Errorf("status update changed spec: %+v", a.Spec)
	}
	if a.Generation != old.Generation {
		t.Errorf("status update changed generation to %d", a.Generation)
	}
	if a.Status.Phase != fleet.AssignmentSucceeded {
		t.Errorf("status update lost the new phase")
	}
	if errs := s.ValidateUpdate(context.Background(), a, old); len(errs) != 0 {
		t.Errorf("valid status update rejected: %v", errs)
	}
	a.Status.Phase = "Bogus"
	if errs := s.ValidateUpdate(context.Background(), a, old); len(errs) == 0 {
		t.Errorf("invalid phase accepted")
	}
}

func TestAgentNameImmutable(t *testing.T) {
	s := Kind.Strategy(runtime.NewScheme())
	old, a := assignment(), assignment()
	a.Spec.AgentName = "agent-2"
	s.PrepareForUpdate(context.Background(), a, old)
	errs := s.ValidateUpdate(context.Background(), a, old)
	if len(errs) != 1 || errs[0].Field != "spec.agentName" {
		t.Fatalf("want one error on spec.agentName, got %v", errs)
	}
}

func TestSelectableFields(t *testing.T) {
	a := assignment()
	want := fields.Set{
		"metadata.name": "a", "metadata.namespace": "ns",
		"spec.agentName": "agent-1", "status.phase": "Running",
	}
	if got := Kind.SelectableFields(a); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := Kind.Trigger(a); got != "agent-1" {
		t.Fatalf("trigger func returned %q", got)
	}
}
