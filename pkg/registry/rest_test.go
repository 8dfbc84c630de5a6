package registry

import (
	"context"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/storage"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher"
)

// Our cache shares its objects with the lists the registry hands it.
var _ cacher.SharingList = &storageList[fleet.Assignment, *fleet.Assignment]{}

// listStorage answers every list with objs at resourceVersion 5: shared
// with a list that takes them, as our cache does, or copied, as etcd3 and
// upstream's cache do.
type listStorage struct {
	storage.Interface
	objs  []runtime.Object
	share bool
}

func (s *listStorage) GetList(_ context.Context, _ string, _ storage.ListOptions, listObj runtime.Object) error {
	if l, ok := listObj.(cacher.SharingList); ok && s.share {
		l.ShareItems(s.objs)
	} else if err := meta.SetList(listObj, s.objs); err != nil {
		return err
	}
	l, err := meta.ListAccessor(listObj)
	if err != nil {
		return err
	}
	l.SetResourceVersion("5")
	return nil
}

// TestRESTList: List answers with the objects storage shared, or with the
// resource's own list type when storage copied them.
func TestRESTList(t *testing.T) {
	items := assignments(3, 4)
	objs := []runtime.Object{&items[0], &items[1], &items[2]}
	for _, share := range []bool{true, false} {
		store := &genericregistry.Store{
			NewFunc:                  func() runtime.Object { return &fleet.Assignment{} },
			NewListFunc:              func() runtime.Object { return &fleet.AssignmentList{} },
			DefaultQualifiedResource: fleet.Resource("assignments"),
			KeyRootFunc:              func(context.Context) string { return "/assignments" },
			KeyFunc:                  func(_ context.Context, name string) (string, error) { return "/assignments/" + name, nil },
			PredicateFunc: func(l labels.Selector, f fields.Selector) storage.SelectionPredicate {
				return storage.SelectionPredicate{Label: l, Field: f}
			},
			Storage: genericregistry.DryRunnableStorage{Storage: &listStorage{objs: objs, share: share}},
		}
		out, err := NewREST[fleet.Assignment](store).List(context.Background(), &metainternalversion.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if l, err := meta.ListAccessor(out); err != nil || l.GetResourceVersion() != "5" {
			t.Errorf("share=%v: list metadata lost: %v %v", share, l, err)
		}
		switch l := out.(type) {
		case *sharedList:
			if !share {
				t.Fatal("copied items answered as a shared list")
			}
			for i := range objs {
				if l.Items[i] != objs[i] {
					t.Errorf("item %d is not the object storage shared", i)
				}
			}
		case *fleet.AssignmentList:
			if share {
				t.Fatal("shared objects were copied")
			}
			if !apiequality.Semantic.DeepEqual(l.Items, items) {
				t.Errorf("items %+v, want %+v", l.Items, items)
			}
		default:
			t.Fatalf("share=%v: List answered %T", share, out)
		}
	}
}
