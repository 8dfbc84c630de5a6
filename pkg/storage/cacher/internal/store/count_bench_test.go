package store

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
)

// BenchmarkRemaining compares two ways of counting what is left in range
// after a page, halfway through 100,000 objects of 1 KiB: walking it,
// reading each object's key as Scan does, and Count. The objects are
// allocated in a random order, as a cache's objects lie once they have
// been replaced over time, and in key order, as a start's list leaves
// them, where a walk reads memory in order and costs less.
//
//	go test ./pkg/storage/cacher/internal/store -run '^$' -bench Remaining -count 5
func BenchmarkRemaining(b *testing.B) {
	const n = 100_000
	for _, order := range []string{"random", "sequential"} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("/registry/agents/ns-%d/agent-%06d", i*10/n, i)
		}
		perm := rand.Perm(n)
		if order == "sequential" {
			for i := range perm {
				perm[i] = i
			}
		}
		objs := make([]*object.Object, n)
		for _, i := range perm {
			// The key a string of its own beside the object's bytes, as
			// the builder makes it.
			objs[i] = &object.Object{Key: strings.Clone(keys[i]), Raw: make([]byte, 1645), RV: 1}
		}
		s := New[*event](nil)
		s.Replace(objs, 1)
		sn := s.Latest()
		prefix, from := "/registry/agents/", objs[n/2].Key
		b.Run("order="+order+"/walk", func(b *testing.B) {
			for b.Loop() {
				left := 0
				sn.Scan(prefix, true, from, func(*object.Object) bool {
					left++
					return true
				})
				if left != n/2 {
					b.Fatalf("walked %d, want %d", left, n/2)
				}
			}
		})
		b.Run("order="+order+"/count", func(b *testing.B) {
			for b.Loop() {
				if left := sn.Count(prefix, from); left != n/2 {
					b.Fatalf("counted %d, want %d", left, n/2)
				}
			}
		})
	}
}
