package registry

import (
	"context"
	"strings"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/features"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/storage"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

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

func (s *listStorage) GetList(_ context.Context, _ string, opts storage.ListOptions, listObj runtime.Object) error {
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
	if opts.Predicate.ShardSelector != nil {
		listObj.(metav1.ShardedListInterface).SetShardInfo(&metav1.ShardInfo{Selector: opts.Predicate.ShardSelector.String()})
	}
	return nil
}

// assignmentStore is a generic store of Assignments over s.
func assignmentStore(s storage.Interface) *genericregistry.Store {
	return &genericregistry.Store{
		NewFunc:                  func() runtime.Object { return &fleet.Assignment{} },
		NewListFunc:              func() runtime.Object { return &fleet.AssignmentList{} },
		DefaultQualifiedResource: fleet.Resource("assignments"),
		KeyRootFunc:              func(context.Context) string { return "/assignments" },
		KeyFunc:                  func(_ context.Context, name string) (string, error) { return "/assignments/" + name, nil },
		PredicateFunc: func(l labels.Selector, f fields.Selector) storage.SelectionPredicate {
			return storage.SelectionPredicate{Label: l, Field: f}
		},
		Storage: genericregistry.DryRunnableStorage{Storage: s},
	}
}

// TestRESTList: List answers with the objects storage shared, or with the
// resource's own list type when storage copied them, with the list
// metadata storage set, a sharded list's ShardInfo included.
func TestRESTList(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ShardedListAndWatch, true)
	items := assignments(3, 4)
	objs := []runtime.Object{&items[0], &items[1], &items[2]}
	const shard = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
	for _, share := range []bool{true, false} {
		out, err := NewREST[fleet.Assignment](assignmentStore(&listStorage{objs: objs, share: share})).List(context.Background(), &metainternalversion.ListOptions{ShardSelector: shard})
		if err != nil {
			t.Fatal(err)
		}
		if l, err := meta.ListAccessor(out); err != nil || l.GetResourceVersion() != "5" {
			t.Errorf("share=%v: list metadata lost: %v %v", share, l, err)
		}
		if info := out.(metav1.ShardedListInterface).GetShardInfo(); info == nil || info.Selector != shard {
			t.Errorf("share=%v: shardInfo %+v, want the selector echoed", share, info)
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

// TestRESTRejectsBadShardSelectors: with the ShardedListAndWatch gate on,
// a shard selector that does not parse gets 400 with the parser's message
// from List and Watch, where upstream answers 500; with it off the
// selector is ignored, as upstream ignores it.
func TestRESTRejectsBadShardSelectors(t *testing.T) {
	items := assignments(1, 1)
	rest := NewREST[fleet.Assignment](assignmentStore(&listStorage{objs: []runtime.Object{&items[0]}}))
	tests := []struct {
		name, selector string
		gate           bool
		want           string
	}{
		{name: "short bound", selector: "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')", gate: true,
			want: "invalid shard selector: hexStart must be a 0x-prefixed 16-digit hex value"},
		{name: "unknown field", selector: "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')", gate: true,
			want: "unsupported field path"},
		{name: "not CEL", selector: "shardRange(", gate: true, want: "CEL parse error"},
		{name: "mixed fields", selector: "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || " +
			"shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000')", gate: true, want: "same field"},
		{name: "empty range", selector: "shardRange(object.metadata.uid, '0x8000000000000000', '0x8000000000000000')", gate: true,
			want: "must be less than end"},
		{name: "gate off", selector: "shardRange(", gate: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ShardedListAndWatch, tc.gate)
			_, listErr := rest.List(context.Background(), &metainternalversion.ListOptions{ShardSelector: tc.selector})
			errs := map[string]error{"list": listErr}
			if tc.want != "" {
				// The fake storage has no watch: only a refused one is safe to ask for.
				_, errs["watch"] = rest.Watch(context.Background(), &metainternalversion.ListOptions{ShardSelector: tc.selector})
			}
			for verb, err := range errs {
				if tc.want == "" {
					if apierrors.IsBadRequest(err) {
						t.Errorf("%s: %v, want the selector ignored", verb, err)
					}
					continue
				}
				if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: %v, want 400 saying %q", verb, err, tc.want)
				}
			}
		})
	}
}

// TestRESTRejectsNegativeTimeouts: a negative timeoutSeconds gets 400
// from List and Watch (upstream's watch-list answered 500: its deadline
// had passed before it began); 0 and positive ones pass.
func TestRESTRejectsNegativeTimeouts(t *testing.T) {
	items := assignments(1, 1)
	rest := NewREST[fleet.Assignment](assignmentStore(&listStorage{objs: []runtime.Object{&items[0]}}))
	for _, tc := range []struct {
		seconds int64
		want    bool
	}{{-5, true}, {-1, true}, {0, false}, {30, false}} {
		opts := &metainternalversion.ListOptions{TimeoutSeconds: &tc.seconds}
		_, listErr := rest.List(context.Background(), opts)
		if got := apierrors.IsBadRequest(listErr); got != tc.want {
			t.Errorf("list, timeoutSeconds=%d: %v, want 400: %v", tc.seconds, listErr, tc.want)
		}
		if tc.want {
			// The fake storage has no watch: only a refused one is safe to ask for.
			_, watchErr := rest.Watch(context.Background(), opts)
			if !apierrors.IsBadRequest(watchErr) || !strings.Contains(watchErr.Error(), "timeoutSeconds must be") {
				t.Errorf("watch, timeoutSeconds=%d: %v, want 400 naming timeoutSeconds", tc.seconds, watchErr)
			}
		}
	}
}
