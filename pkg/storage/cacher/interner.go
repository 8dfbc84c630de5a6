package cacher

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// defaultInternBudget bounds what an interner's tables hold, per cache.
const defaultInternBudget = 8 << 20

// interner makes the objects a cache holds share equal metadata instead of
// each carrying its own decoded copy: the namespace, label keys and values,
// annotation keys (not values: they are data), finalizers, owner references'
// kinds, and managedFields' strings, timestamps and field sets. Those repeat
// across objects (one manager writes the same fields of every object it
// creates, within the same second), and at 1 KiB objects they were about a
// tenth of each object's heap. Objects in the cache are read-only, so
// sharing between them is as safe as sharing one object between readers.
//
// The tables only grow, up to a byte budget; past it new values are no
// longer added, and what is in the tables is still shared.
type interner struct {
	// mu guards everything below.
	mu       sync.Mutex
	strings  map[string]string
	fieldsV1 map[string]*metav1.FieldsV1
	times    map[time.Time]*metav1.Time
	// bytes estimates what the tables hold; budget bounds it.
	bytes, budget int64
}

func newInterner(budget int64) *interner {
	return &interner{strings: map[string]string{}, fieldsV1: map[string]*metav1.FieldsV1{}, times: map[time.Time]*metav1.Time{},
		budget: budget}
}

// object replaces obj's metadata by shared equal values. obj must not be
// shared yet.
func (in *interner) object(obj runtime.Object) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if ns := m.GetNamespace(); ns != "" {
		m.SetNamespace(in.str(ns))
	}
	if l := m.GetLabels(); len(l) > 0 {
		shared := make(map[string]string, len(l))
		for k, v := range l {
			shared[in.str(k)] = in.str(v)
		}
		m.SetLabels(shared)
	}
	if a := m.GetAnnotations(); len(a) > 0 {
		shared := make(map[string]string, len(a))
		for k, v := range a {
			shared[in.str(k)] = v
		}
		m.SetAnnotations(shared)
	}
	f := m.GetFinalizers()
	for i := range f {
		f[i] = in.str(f[i])
	}
	refs := m.GetOwnerReferences()
	for i := range refs {
		refs[i].APIVersion = in.str(refs[i].APIVersion)
		refs[i].Kind = in.str(refs[i].Kind)
	}
	mf := m.GetManagedFields()
	for i := range mf {
		e := &mf[i]
		e.Manager = in.str(e.Manager)
		e.Operation = metav1.ManagedFieldsOperationType(in.str(string(e.Operation)))
		e.APIVersion = in.str(e.APIVersion)
		e.FieldsType = in.str(e.FieldsType)
		e.Subresource = in.str(e.Subresource)
		e.Time = in.time(e.Time)
		e.FieldsV1 = in.fields(e.FieldsV1)
	}
}

func (in *interner) str(s string) string {
	if s == "" {
		return s
	}
	if shared, ok := in.strings[s]; ok {
		return shared
	}
	if in.add(int64(len(s)) + 32) {
		in.strings[s] = s
	}
	return s
}

func (in *interner) fields(f *metav1.FieldsV1) *metav1.FieldsV1 {
	if f == nil {
		return nil
	}
	if shared, ok := in.fieldsV1[string(f.Raw)]; ok {
		return shared
	}
	if in.add(2*int64(len(f.Raw)) + 64) {
		in.fieldsV1[string(f.Raw)] = f
	}
	return f
}

// time shares timestamps. Only those in time.Local, where metav1.Time's
// decoder puts them, so that equal keys mean equal values.
func (in *interner) time(t *metav1.Time) *metav1.Time {
	if t == nil || t.Location() != time.Local {
		return t
	}
	if shared, ok := in.times[t.Time]; ok {
		return shared
	}
	if in.add(64) {
		in.times[t.Time] = t
	}
	return t
}

// add reports whether n more bytes fit the budget, and counts them if so.
func (in *interner) add(n int64) bool {
	if in.bytes+n > in.budget {
		return false
	}
	in.bytes += n
	return true
}
