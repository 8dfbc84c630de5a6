package source

import "testing"

// value is a gauge that keeps what it was set to.
type value float64

func (v *value) Set(f float64) { *v = value(f) }

// TestReadiness checks the unready gauge and the change channel through a
// cache's life: initializing, ready, re-listing, stopped; stopped is final.
func TestReadiness(t *testing.T) {
	var unready value
	r := NewReadiness(&unready)
	if unready != 1 {
		t.Fatalf("a new readiness: unready reads %v, want 1", unready)
	}
	for _, step := range []struct {
		to      State
		want    State
		unready value
		changed bool
	}{
		{Ready, Ready, 0, true},
		{Ready, Ready, 0, false},
		{Pending, Pending, 1, true},
		{Ready, Ready, 0, true},
		{Pending, Pending, 1, true},
		{Stopped, Stopped, 0, true},
		{Pending, Stopped, 0, false},
	} {
		_, changed := r.Get()
		r.Set(step.to)
		got, _ := r.Get()
		closed := false
		select {
		case <-changed:
			closed = true
		default:
		}
		if got != step.want || unready != step.unready || closed != step.changed {
			t.Fatalf("after Set(%d): state %d, unready %v, changed %v; want %d, %v, %v",
				step.to, got, unready, closed, step.want, step.unready, step.changed)
		}
	}
}
