package faults

import (
	"bytes"
	"os"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/inject"
	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// TestServerHoldsNoFailpoint checks that the server users run carries no
// failpoint: none of their names, none of their errors, and not the
// variable that arms them, where the faultinject build, which the check
// must be able to tell apart, holds them all.
func TestServerHoldsNoFailpoint(t *testing.T) {
	bins := testkit.Build(t, testkit.Ours, oursFaulty)
	marks := [][]byte{[]byte(inject.FailpointsEnvName), []byte(inject.ErrFailpoint), []byte(inject.ErrEndWatch),
		[]byte(inject.ErrRepeat), []byte(inject.ErrStall), []byte(inject.ErrMismatch)}
	for _, p := range inject.Points {
		// The names that are words of their own (replay, relist) stand in
		// other strings too: the distinctive ones say enough.
		if bytes.ContainsRune([]byte(p), '-') {
			marks = append(marks, []byte(p))
		}
	}
	shipped, err := os.ReadFile(bins[0])
	if err != nil {
		t.Fatal(err)
	}
	faulty, err := os.ReadFile(bins[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range marks {
		if bytes.Contains(shipped, m) {
			t.Errorf("the server holds %q, a failpoint's", m)
		}
		if !bytes.Contains(faulty, m) {
			t.Errorf("the faultinject build lacks %q: the check cannot tell the builds apart", m)
		}
	}
}
