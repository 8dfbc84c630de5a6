package cacher

import (
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// defaultInternBudget bounds what an interner's tables hold, per cache.
const defaultInternBudget = 8 << 20

// interner makes the objects a cache holds share equal metadata instead of
// each carrying its own decoded copy: the namespace, label sets (the whole
// map), annotation keys (not values: they are data), finalizers, owner
// references' kinds, and managedFields (the whole list when equal, else
// its strings, timestamps and field sets). Those repeat across objects:
// the objects of one owner carry the same labels, and one manager writes
// the same fields of every object it creates, within the same second. At
// 1 KiB objects they were about a fifth of each object's heap; a label
// map of one entry alone takes about 300 bytes. Objects in the cache are
// read-only, so sharing between them is as safe as sharing one object
// between readers.
//
// The tables only grow, up to a byte budget; past it new values are no
// longer added, and what is in the tables is still shared.
type interner struct {
	// mu guards everything below.
	mu       sync.Mutex
	strings  map[string]string
	fieldsV1 map[string]sharedFields
	times    map[time.Time]sharedTime
	// labels and managed are whole label sets and managedFields lists, by
	// a key spelling out their contents (see labelSet and managedFields).
	labels  map[string]map[string]string
	managed map[string][]metav1.ManagedFieldsEntry
	// key is scratch space for the keys of labels and managed.
	key []byte
	// bytes estimates what the tables hold; budget bounds it.
	bytes, budget int64
}

// sharedFields and sharedTime are shared values with a number of their own,
// which stands for them in the keys of whole managedFields lists.
type sharedFields struct {
	f  *metav1.FieldsV1
	id int
}

type sharedTime struct {
	t  *metav1.Time
	id int
}

func newInterner(budget int64) *interner {
	return &interner{strings: map[string]string{}, fieldsV1: map[string]sharedFields{}, times: map[time.Time]sharedTime{},
		labels: map[string]map[string]string{}, managed: map[string][]metav1.ManagedFieldsEntry{}, budget: budget}
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
		m.SetLabels(in.labelSet(l))
	}
	// In place: assigning to a string key that is there already stores
	// the key given, so the map keeps the shared keys without a second
	// map, whose garbage would leave holes among the maps that stay.
	a := m.GetAnnotations()
	for k, v := range a {
		a[in.str(k)] = v
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
	if mf := m.GetManagedFields(); len(mf) > 0 {
		m.SetManagedFields(in.managedFields(mf))
	}
}

// labelSet returns the shared label map equal to l: l itself, with its
// keys and values shared, if there is none yet.
func (in *interner) labelSet(l map[string]string) map[string]string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	in.key = in.key[:0]
	for _, k := range keys {
		in.keyString(k)
		in.keyString(l[k])
	}
	if shared, ok := in.labels[string(in.key)]; ok {
		return shared
	}
	shared := make(map[string]string, len(l))
	for k, v := range l {
		shared[in.str(k)] = in.str(v)
	}
	if in.add(int64(len(in.key)) + 64 + 48*int64(len(l))) {
		in.labels[string(in.key)] = shared
	}
	return shared
}

// keyString appends s to the key, after its length, so that no two
// sequences of strings spell the same key.
func (in *interner) keyString(s string) {
	in.key = append(binary.AppendUvarint(in.key, uint64(len(s))), s...)
}

// managedFields shares mf's parts, and returns the shared list equal to mf
// if every part is shared: mf itself if there is none yet.
func (in *interner) managedFields(mf []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	in.key = in.key[:0]
	whole := true
	for i := range mf {
		e := &mf[i]
		e.Manager = in.str(e.Manager)
		e.Operation = metav1.ManagedFieldsOperationType(in.str(string(e.Operation)))
		e.APIVersion = in.str(e.APIVersion)
		e.FieldsType = in.str(e.FieldsType)
		e.Subresource = in.str(e.Subresource)
		var timeID, fieldsID int
		e.Time, timeID = in.time(e.Time)
		e.FieldsV1, fieldsID = in.fields(e.FieldsV1)
		// -1: present but not shared, so the list cannot be either.
		whole = whole && timeID >= 0 && fieldsID >= 0
		for _, s := range []string{e.Manager, string(e.Operation), e.APIVersion, e.FieldsType, e.Subresource} {
			in.keyString(s)
		}
		in.key = binary.AppendVarint(binary.AppendVarint(in.key, int64(timeID)), int64(fieldsID))
	}
	if !whole {
		return mf
	}
	if shared, ok := in.managed[string(in.key)]; ok {
		return shared
	}
	if in.add(int64(len(in.key)) + 32 + 96*int64(len(mf))) {
		in.managed[string(in.key)] = mf
	}
	return mf
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

// fields returns the shared FieldsV1 equal to f and its number; 0 for nil,
// -1 if f cannot be shared.
func (in *interner) fields(f *metav1.FieldsV1) (*metav1.FieldsV1, int) {
	if f == nil {
		return nil, 0
	}
	if shared, ok := in.fieldsV1[string(f.Raw)]; ok {
		return shared.f, shared.id
	}
	if !in.add(2*int64(len(f.Raw)) + 72) {
		return f, -1
	}
	id := len(in.fieldsV1) + 1
	in.fieldsV1[string(f.Raw)] = sharedFields{f: f, id: id}
	return f, id
}

// time shares timestamps, and returns one's number as fields does. Only
// those in time.Local, where metav1.Time's decoder puts them, so that
// equal keys mean equal values.
func (in *interner) time(t *metav1.Time) (*metav1.Time, int) {
	if t == nil {
		return nil, 0
	}
	if t.Location() != time.Local {
		return t, -1
	}
	if shared, ok := in.times[t.Time]; ok {
		return shared.t, shared.id
	}
	if !in.add(72) {
		return t, -1
	}
	id := len(in.times) + 1
	in.times[t.Time] = sharedTime{t: t, id: id}
	return t, id
}

// add reports whether n more bytes fit the budget, and counts them if so.
func (in *interner) add(n int64) bool {
	if in.bytes+n > in.budget {
		return false
	}
	in.bytes += n
	return true
}
