package corpus

import (
	"encoding/json"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fieldSet is a managedFields entry's fieldsV1 as it is built: nested
// sets of "f:name", "k:{…}" and "." keys, every leaf an empty set.
type fieldSet map[string]any

// add puts the path into the set, a key at each level.
func (f fieldSet) add(path ...string) fieldSet {
	cur := f
	for _, k := range path {
		next, ok := cur[k].(fieldSet)
		if !ok {
			next = fieldSet{}
			cur[k] = next
		}
		cur = next
	}
	return f
}

// addMap puts a map field and its keys into the set: "." where the
// manager owns the map itself, then "f:key" for each key.
func (f fieldSet) addMap(owned bool, m map[string]string, path ...string) fieldSet {
	if len(m) == 0 {
		return f
	}
	if owned {
		f.add(append(path, ".")...)
	}
	for k := range m {
		f.add(append(path, "f:"+k)...)
	}
	return f
}

// entry returns the managedFields entry of manager for the set, written at
// t, on the main resource or the status subresource.
func (f fieldSet) entry(manager string, op metav1.ManagedFieldsOperationType, subresource string, t metav1.Time) metav1.ManagedFieldsEntry {
	raw, err := json.Marshal(f) // keys sorted, as the apiserver writes them
	if err != nil {
		panic(err)
	}
	return metav1.ManagedFieldsEntry{
		Manager:     manager,
		Operation:   op,
		APIVersion:  "fleet.example.com/v1beta1",
		Time:        &t,
		FieldsType:  "FieldsV1",
		FieldsV1:    &metav1.FieldsV1{Raw: raw},
		Subresource: subresource,
	}
}

// split gives a controller, with probability p, some of the labels: the
// ones it sets, which the creator's entry then no longer lists.
func (g *Generator) split(labels map[string]string, p float64) (creator, controller map[string]string) {
	if len(labels) < 3 || !g.chance(p) {
		return labels, nil
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	creator, controller = map[string]string{}, map[string]string{}
	for i, k := range keys {
		if i%3 == 2 {
			controller[k] = labels[k]
		} else {
			creator[k] = labels[k]
		}
	}
	return creator, controller
}
