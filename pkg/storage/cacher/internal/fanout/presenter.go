package fanout

import (
	"fmt"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// Presenter makes what selectors and watchers see of a cached object, when
// they need it, instead of the cache keeping it with every object:
//   - its selectable fields as a fields.Set, only for a field selector on a
//     field other than the name and the trigger field. The object keeps
//     the other fields' values in a slice shared between objects (upstream
//     keeps a map of about 350 bytes an object);
//   - its Caching, only when it is sent, dropped with its encodings
//     and its decoded copy by the expiry.
type Presenter struct {
	// trigger is Config.TriggerField; "" if none.
	trigger string
	// codec encodes the objects shared that are not cached.
	codec *object.Codec
	// expiry detaches Cachings; nil keeps them while the object is current.
	expiry *object.Expiry
}

// NewPresenter returns a presenter for objects with trigger as their
// trigger field ("" if none), encoded by codec, whose Cachings expiry
// detaches (nil keeps them while the object is current).
func NewPresenter(trigger string, codec *object.Codec, expiry *object.Expiry) *Presenter {
	return &Presenter{trigger: trigger, codec: codec, expiry: expiry}
}

// caching returns o's Caching, which every sender shares until the
// expiry's TTL passes unused.
func (pr *Presenter) caching(o *object.Object) *object.Caching { return o.Caching(pr.expiry) }

// shared returns a Caching for obj, an object at rv that the cache
// does not hold, such as a bookmark, so that every watcher sent it shares
// its encodings. If it cannot be encoded as cached objects are, its
// encodings are made from obj.
func (pr *Presenter) shared(obj runtime.Object, rv uint64) runtime.Object {
	raw, err := pr.codec.Encode(obj)
	if err != nil {
		klog.ErrorS(err, "Cannot encode an object to share", "type", fmt.Sprintf("%T", obj))
		return obj
	}
	return object.NewCachingOf(&object.Object{Raw: raw, Head: object.TypeHeader(raw), Codec: pr.codec, RV: rv}, obj)
}

// fields returns o's selectable fields for a selector to read; nothing is
// computed until the selector asks for a field other than the trigger.
// A nil o has no fields.
func (pr *Presenter) fields(o *object.Object) *objectFields {
	return &objectFields{pr: pr, o: o}
}

// eventFields are an event's objects' fields, computed at most once for
// all the watchers it is offered to: one allocation an event.
type eventFields struct{ cur, prev objectFields }

func (pr *Presenter) eventFields(e *Event) *eventFields {
	return &eventFields{cur: objectFields{pr: pr, o: e.Cur}, prev: objectFields{pr: pr, o: e.Prev}}
}

// objectFields is one object's selectable fields, computed at most once.
// It is not safe for concurrent use.
type objectFields struct {
	pr   *Presenter
	o    *object.Object
	set  fields.Set
	done bool
}

var _ fields.Fields = &objectFields{}

// Has implements fields.Fields.
func (f *objectFields) Has(name string) bool {
	_, ok := f.compute()[name]
	return ok
}

// Get implements fields.Fields.
func (f *objectFields) Get(name string) string {
	if f.o != nil {
		switch {
		case f.pr.trigger != "" && name == f.pr.trigger:
			// The trigger function and the attributes agree on it: the
			// dispatcher already picks watchers by it.
			return f.o.Trigger
		case name == object.NameField:
			// Every resource's attributes hold the object's name.
			return f.o.Name()
		}
	}
	return f.compute()[name]
}

func (f *objectFields) compute() fields.Set {
	if f.done || f.o == nil {
		return f.set
	}
	f.done = true
	pairs := f.o.Fields()
	f.set = make(fields.Set, len(pairs)/2+2)
	for i := 0; i+1 < len(pairs); i += 2 {
		f.set[pairs[i]] = pairs[i+1]
	}
	f.set[object.NameField] = f.o.Name()
	if f.pr.trigger != "" {
		f.set[f.pr.trigger] = f.o.Trigger
	}
	return f.set
}
