package faults

import (
	"fmt"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

// The resources a client reads: assignments, written busily, and agents,
// idle most of the time.
const (
	assignments = ""
	agentsRes   = "agents"
)

// selector is what one client asks for: a resource, a namespace (or all),
// a label selector and a field selector, in the API's syntax.
type selector struct {
	resource  string
	namespace string
	label     string
	field     string
}

func (s selector) String() string {
	out := "all"
	if s.namespace != "" {
		out = "ns=" + s.namespace
	}
	if s.resource != assignments {
		out = s.resource + " " + out
	}
	if s.label != "" {
		out += " l:" + s.label
	}
	if s.field != "" {
		out += " f:" + s.field
	}
	return out
}

// matcher decides, as the API server must, whether an object version is
// in a selector.
type matcher struct {
	sel   selector
	label labels.Selector
	field fields.Selector
}

func newMatcher(s selector) (matcher, error) {
	m := matcher{sel: s, label: labels.Everything(), field: fields.Everything()}
	var err error
	if s.label != "" {
		if m.label, err = labels.Parse(s.label); err != nil {
			return m, fmt.Errorf("label selector %q: %w", s.label, err)
		}
	}
	if s.field != "" {
		if m.field, err = fields.ParseSelector(s.field); err != nil {
			return m, fmt.Errorf("field selector %q: %w", s.field, err)
		}
	}
	return m, nil
}

func (m matcher) matches(o *objState) bool {
	if o == nil || (m.sel.namespace != "" && o.namespace != m.sel.namespace) {
		return false
	}
	f := fields.Set{"metadata.name": o.name, "metadata.namespace": o.namespace, "spec.agentName": o.agent, "status.phase": o.phase}
	if m.sel.resource == agentsRes {
		f = fields.Set{"metadata.name": o.name, "spec.zone": o.zone}
	}
	return m.label.Matches(labels.Set(o.labels)) && m.field.Matches(f)
}
