package registry

import (
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// storageList is the list a List request hands to storage. etcd, or a
// cache that copies, fills Items as for the resource's own list type; our
// watch cache instead hands over its own objects through ShareItems (see
// cacher.SharingList), which the response then encodes without copying.
type storageList[T any, PT interface {
	*T
	runtime.Object
}] struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []T

	// shared is nil unless the cache shared its objects.
	shared []runtime.Object
}

// ShareItems implements cacher.SharingList.
func (l *storageList[T, PT]) ShareItems(objs []runtime.Object) {
	l.shared = objs
	l.Items = nil
}

// DeepCopyObject implements runtime.Object.
func (l *storageList[T, PT]) DeepCopyObject() runtime.Object {
	out := &storageList[T, PT]{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]T, len(l.Items))
		for i := range l.Items {
			out.Items[i] = *PT(&l.Items[i]).DeepCopyObject().(PT)
		}
	}
	if l.shared != nil {
		out.shared = make([]runtime.Object, len(l.shared))
		for i, o := range l.shared {
			out.shared[i] = o.DeepCopyObject()
		}
	}
	return out
}

// response is what the List verb answers: the shared objects in a
// sharedList, which writes its response compressed with gz if it is not
// nil, or the items storage filled in the resource's list type, moved
// there without a copy.
func (l *storageList[T, PT]) response(newList func() runtime.Object, gz *GzipResponse) (runtime.Object, error) {
	if l.shared != nil {
		return &sharedList{ListMeta: l.ListMeta, Items: l.shared, newList: newList, gzip: gz}, nil
	}
	out := newList()
	items, err := itemsOf(out)
	if err != nil {
		return nil, err
	}
	if items.Type() != reflect.TypeOf(l.Items) {
		return nil, fmt.Errorf("%T has items of %v, not %T", out, items.Type(), l.Items)
	}
	items.Set(reflect.ValueOf(l.Items))
	return out, setListMeta(out, &l.ListMeta)
}

// setListMeta copies the list metadata storage sets into list.
func setListMeta(list runtime.Object, m *metav1.ListMeta) error {
	l, err := meta.ListAccessor(list)
	if err != nil {
		return err
	}
	l.SetResourceVersion(m.ResourceVersion)
	l.SetContinue(m.Continue)
	l.SetRemainingItemCount(m.RemainingItemCount)
	if sharded, ok := list.(metav1.ShardedListInterface); ok {
		sharded.SetShardInfo(m.ShardInfo)
	}
	return nil
}
