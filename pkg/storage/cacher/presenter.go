package cacher

import (
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/klog/v2"
)

// presenter makes what selectors and watchers see of a cached object, when
// they need it, instead of the cache keeping it with every object:
//   - its selectable fields, from Config.GetAttrsFunc, only for a field
//     selector on a field other than the trigger field, whose value the
//     object keeps. Kept, they were a slice of about 150 bytes an object
//     (upstream keeps a map of about 350);
//   - its cachingObject, only when it is sent, dropped with its encodings
//     by the expiry. Kept, it was 80 bytes an object.
//
// At 100,000 objects of 1 KiB those were about a tenth of the cache's heap.
type presenter struct {
	attrs storage.AttrFunc
	// trigger is Config.TriggerField; "" if none.
	trigger string
	// expiry detaches cachingObjects; nil keeps them while the object is current.
	expiry *encodingExpiry
}

// caching returns o's cachingObject, making it if o has none: every sender
// until the expiry's TTL passes unused shares one, and so one encoding per
// serializer.
func (pr *presenter) caching(o *object) *cachingObject {
	for {
		if co := o.co.Load(); co != nil {
			if pr.expiry != nil {
				pr.expiry.touch(co)
			}
			return co
		}
		co := newCachingObject(o.obj)
		co.slot = &o.co
		if o.co.CompareAndSwap(nil, co) {
			if pr.expiry != nil {
				pr.expiry.add(co)
			}
			return co
		}
	}
}

// fields returns o's selectable fields for a selector to read; nothing is
// computed until the selector asks for a field other than the trigger.
// A nil o has no fields.
func (pr *presenter) fields(o *object) *objectFields {
	return &objectFields{pr: pr, o: o}
}

// eventFields are an event's objects' fields, computed at most once for
// all the watchers it is offered to: one allocation an event.
type eventFields struct{ cur, prev objectFields }

func (pr *presenter) eventFields(e *event) *eventFields {
	return &eventFields{cur: objectFields{pr: pr, o: e.cur}, prev: objectFields{pr: pr, o: e.prev}}
}

// objectFields is one object's selectable fields, computed at most once.
// It is not safe for concurrent use.
type objectFields struct {
	pr   *presenter
	o    *object
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
			return f.o.trigger
		case name == nameField:
			// Every resource's attributes hold the object's name.
			return f.o.name
		}
	}
	return f.compute()[name]
}

func (f *objectFields) compute() fields.Set {
	if f.done || f.o == nil {
		return f.set
	}
	f.done = true
	_, set, err := f.pr.attrs(f.o.obj)
	if err != nil {
		// Ingest computed them once already, for the same immutable object.
		klog.ErrorS(err, "Cannot compute the selectable fields of a cached object", "key", f.o.key)
	}
	f.set = set
	return set
}
