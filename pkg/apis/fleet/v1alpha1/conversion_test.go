package v1alpha1_test

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/install"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1alpha1"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
)

func newScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	install.Install(s)
	return s
}

func TestAssignmentConversion(t *testing.T) {
	s := newScheme(t)
	in := &v1alpha1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"},
		Spec:       v1alpha1.AssignmentSpec{Agent: "agent-7", Payload: "p", Priority: 5},
		Status:     v1alpha1.AssignmentStatus{Phase: v1alpha1.AssignmentRunning, ObservedGeneration: 3},
	}
	internal := &fleet.Assignment{}
	if err := s.Convert(in, internal, nil); err != nil {
		t.Fatal(err)
	}
	if internal.Spec.AgentName != "agent-7" || internal.Spec.Priority != 5 || internal.Status.Phase != fleet.AssignmentRunning {
		t.Fatalf("v1alpha1 -> internal lost data: %+v", internal)
	}
	beta := &v1beta1.Assignment{}
	if err := s.Convert(internal, beta, nil); err != nil {
		t.Fatal(err)
	}
	if beta.Spec.AgentName != "agent-7" {
		t.Fatalf("internal -> v1beta1: agentName = %q", beta.Spec.AgentName)
	}
	back := &v1alpha1.Assignment{}
	if err := s.Convert(internal, back, nil); err != nil {
		t.Fatal(err)
	}
	if back.Spec != in.Spec {
		t.Fatalf("round trip through internal: got %+v, want %+v", back.Spec, in.Spec)
	}
}

func TestDefaulting(t *testing.T) {
	s := newScheme(t)
	for _, obj := range []runtime.Object{&v1alpha1.Assignment{}, &v1beta1.Assignment{}} {
		s.Default(obj)
		var phase string
		switch a := obj.(type) {
		case *v1alpha1.Assignment:
			phase = string(a.Status.Phase)
		case *v1beta1.Assignment:
			phase = string(a.Status.Phase)
		}
		if phase != "Pending" {
			t.Errorf("%T: defaulted phase = %q, want Pending", obj, phase)
		}
	}
}

func TestFieldLabelConversion(t *testing.T) {
	s := newScheme(t)
	tests := []struct {
		name      string
		gvk       string
		label     string
		want      string
		wantError bool
	}{
		{name: "v1alpha1 agent is renamed", gvk: "v1alpha1/Assignment", label: "spec.agent", want: "spec.agentName"},
		{name: "v1alpha1 rejects the v1beta1 spelling", gvk: "v1alpha1/Assignment", label: "spec.agentName", wantError: true},
		{name: "v1beta1 agentName", gvk: "v1beta1/Assignment", label: "spec.agentName", want: "spec.agentName"},
		{name: "v1beta1 phase", gvk: "v1beta1/Assignment", label: "status.phase", want: "status.phase"},
		{name: "namespace", gvk: "v1alpha1/Assignment", label: "metadata.namespace", want: "metadata.namespace"},
		{name: "unsupported field", gvk: "v1beta1/Assignment", label: "spec.payload", wantError: true},
		{name: "agent zone", gvk: "v1beta1/Agent", label: "spec.zone", want: "spec.zone"},
		{name: "agent has no namespace", gvk: "v1alpha1/Agent", label: "metadata.namespace", wantError: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			version, kind, _ := strings.Cut(tc.gvk, "/")
			gvk := v1beta1.SchemeGroupVersion.WithKind(kind)
			gvk.Version = version
			got, value, err := s.ConvertFieldLabel(gvk, tc.label, "x")
			if tc.wantError {
				if err == nil || !strings.Contains(err.Error(), "supported field selectors are") {
					t.Fatalf("want an error naming the supported selectors, got %v", err)
				}
				return
			}
			if err != nil || got != tc.want || value != "x" {
				t.Fatalf("got (%q, %q, %v), want (%q, x, nil)", got, value, err, tc.want)
			}
		})
	}
}
