package assignment

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/registry/table"
)

// tableConvertor prints NAME, AGENT, PHASE, PRIORITY, AGE.
var tableConvertor = table.Convertor[*fleet.Assignment]{Columns: []table.Column[*fleet.Assignment]{
	{
		Definition: metav1.TableColumnDefinition{Name: "Agent", Type: "string", Description: "The agent that runs the assignment."},
		Cell:       func(a *fleet.Assignment) any { return a.Spec.AgentName },
	},
	{
		Definition: metav1.TableColumnDefinition{Name: "Phase", Type: "string", Description: "Pending, Running, Succeeded or Failed."},
		Cell:       func(a *fleet.Assignment) any { return string(a.Status.Phase) },
	},
	{
		Definition: metav1.TableColumnDefinition{Name: "Priority", Type: "integer", Description: "Higher runs first."},
		Cell:       func(a *fleet.Assignment) any { return int64(a.Spec.Priority) },
	},
}}
