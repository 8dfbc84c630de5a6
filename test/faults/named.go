package faults

import (
	"fmt"

	"k8s.io/apimachinery/pkg/fields"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// Single-object selectors (fieldSelector metadata.name=…, in a namespace)
// select one key of the truth. The load's 20,000 of them are checked
// against that key's changes alone: each against every change, and each
// list against the whole state at its resourceVersion, as the other
// selectors are, is billions of matches.

// keyOf returns the one key sel can select, if it selects by name in a
// namespace or over agents, which are cluster-scoped.
func (sel selector) keyOf() (string, bool) {
	if sel.field == "" {
		return "", false
	}
	fs, err := fields.ParseSelector(sel.field)
	if err != nil {
		return "", false
	}
	name, ok := fs.RequiresExactMatch("metadata.name")
	switch {
	case !ok:
		return "", false
	case sel.resource == agentsRes:
		return name, true
	case sel.namespace == "":
		return "", false // a name in every namespace: more than one key
	}
	return sel.namespace + "/" + name, true
}

// changesOf returns the truth's changes a stream of sel must be checked
// against: every change, or, for a single-object selector, that key's.
// Either gives CheckSegment the same answer; the second in a fraction of
// the time.
func (e *env) changesOf(sel selector) ([]watchcheck.Change[objState], error) {
	t := e.truthOf(sel)
	changes, err := t.Changes()
	key, ok := sel.keyOf()
	if err != nil || !ok {
		return changes, err
	}
	// Built once, in validate, when the traffic has stopped.
	if e.byKey == nil {
		e.byKey = map[*truth]map[string][]watchcheck.Change[objState]{}
	}
	idx, ok := e.byKey[t]
	if !ok {
		idx = map[string][]watchcheck.Change[objState]{}
		for _, c := range changes {
			idx[c.Key] = append(idx[c.Key], c)
		}
		e.byKey[t] = idx
	}
	return idx[key], nil
}

// checkList checks list against the truth of sel as watchcheck.CheckList
// does; for a single-object selector from that key's history alone, not
// from the whole state at the list's resourceVersion.
func (e *env) checkList(sel selector, m matcher, list watchcheck.List) watchcheck.Violations {
	t := e.truthOf(sel)
	key, ok := sel.keyOf()
	if !ok {
		return watchcheck.CheckList(t, m.matches, list)
	}
	var v watchcheck.Violations
	if list.Rev < list.MinRev {
		v.Note(&v.Consistent, "%s: consistent list at %d, older than a write acknowledged at %d before it", list.Who, list.Rev, list.MinRev)
	}
	if list.Rev < t.Start {
		v.Note(&v.Lists, "%s: list at %d, before the history began at %d: cannot be checked", list.Who, list.Rev, t.Start)
		return v
	}
	changes, err := e.changesOf(sel)
	if err != nil {
		v.Note(&v.Lists, "%s: the ground truth is incomplete: %v", list.Who, err)
		return v
	}
	cur, present := t.Initial[key]
	for _, c := range changes {
		if c.Rev > list.Rev {
			break
		}
		cur, present = watchcheck.Version[objState]{Rev: c.Rev, Obj: c.Cur}, c.Cur != nil
	}
	want := map[string]int64{}
	if present && m.matches(cur.Obj) {
		want[key] = cur.Rev
	}
	if d, _ := watchcheck.Diff(want, list.Items); d != "" {
		v.Note(&v.Lists, "%s: list at %d differs from etcd: %s; in etcd, %s", list.Who, list.Rev, d, t.Describe(key))
	}
	return v
}

// nameSelector selects the assignment name in namespace ns.
func nameSelector(ns, name string) selector {
	return selector{namespace: ns, field: fmt.Sprintf("metadata.name=%s", name)}
}
