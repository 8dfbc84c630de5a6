// Package table converts fleet objects to server-side tables, so that
// kubectl get prints resource-specific columns.
package table

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apiserver/pkg/registry/rest"
)

// Column is one table column and how to fill it from an object.
type Column[T runtime.Object] struct {
	// Definition is the column header as clients see it.
	Definition metav1.TableColumnDefinition
	// Cell returns the column's value for one object.
	Cell func(T) any
}

// Convertor builds tables with a NAME column first, the given columns, then AGE.
type Convertor[T runtime.Object] struct {
	// Columns are the resource-specific columns between NAME and AGE.
	Columns []Column[T]
}

var _ rest.TableConvertor = Convertor[runtime.Object]{}

// ConvertToTable implements rest.TableConvertor for one object or a list.
func (c Convertor[T]) ConvertToTable(_ context.Context, obj runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	table := &metav1.Table{}
	if opts, ok := tableOptions.(*metav1.TableOptions); !ok || !opts.NoHeaders {
		table.ColumnDefinitions = c.definitions()
	}
	add := func(o runtime.Object) error {
		t, ok := o.(T)
		if !ok {
			// The watch cache's items are kept encoded, and their
			// DeepCopyObject decodes them (cacher.SharingList).
			if t, ok = o.DeepCopyObject().(T); ok {
				o = t
			}
		}
		if !ok {
			return fmt.Errorf("cannot print %T in this table", o)
		}
		m, err := meta.Accessor(o)
		if err != nil {
			return err
		}
		cells := make([]any, 0, len(c.Columns)+2)
		cells = append(cells, m.GetName())
		for _, col := range c.Columns {
			cells = append(cells, col.Cell(t))
		}
		cells = append(cells, age(m.GetCreationTimestamp()))
		table.Rows = append(table.Rows, metav1.TableRow{Cells: cells, Object: runtime.RawExtension{Object: o}})
		return nil
	}
	if meta.IsListType(obj) {
		if err := meta.EachListItem(obj, add); err != nil {
			return nil, err
		}
		if l, err := meta.ListAccessor(obj); err == nil {
			table.ResourceVersion = l.GetResourceVersion()
			table.Continue = l.GetContinue()
			table.RemainingItemCount = l.GetRemainingItemCount()
		}
		return table, nil
	}
	if err := add(obj); err != nil {
		return nil, err
	}
	if m, err := meta.Accessor(obj); err == nil {
		table.ResourceVersion = m.GetResourceVersion()
	}
	return table, nil
}

func (c Convertor[T]) definitions() []metav1.TableColumnDefinition {
	defs := []metav1.TableColumnDefinition{{Name: "Name", Type: "string", Format: "name", Description: "Name of the object."}}
	for _, col := range c.Columns {
		defs = append(defs, col.Definition)
	}
	return append(defs, metav1.TableColumnDefinition{Name: "Age", Type: "string", Description: "Time since the object was created."})
}

func age(t metav1.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(time.Since(t.Time))
}
