package agent

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry/table"
)

// tableConvertor prints NAME, ZONE, READY, AGE.
var tableConvertor = table.Convertor[*fleet.Agent]{Columns: []table.Column[*fleet.Agent]{
	{
		Definition: metav1.TableColumnDefinition{Name: "Zone", Type: "string", Description: "The agent's failure domain."},
		Cell:       func(a *fleet.Agent) any { return a.Spec.Zone },
	},
	{
		Definition: metav1.TableColumnDefinition{Name: "Ready", Type: "string", Description: "Status of the Ready condition."},
		Cell:       ready,
	},
}}

// ready prints the Ready condition's status, or Unknown before the agent reported.
func ready(a *fleet.Agent) any {
	if c := meta.FindStatusCondition(a.Status.Conditions, fleet.AgentConditionReady); c != nil {
		return string(c.Status)
	}
	return string(metav1.ConditionUnknown)
}
