// Package shard is sharded list and watch (KEP-5866, the
// ShardedListAndWatch feature gate) as numbers: selectors parsed into
// sorted, disjoint hash ranges, and the hashes they compare.
package shard

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/sharding"
)

// Sharded list and watch select objects by the 64-bit FNV-1a hash of their UID or namespace. The
// cache hashes both once per object version, at ingest, and compares
// numbers; upstream resolves the field and formats the hash as hex for
// every object a sharded list or watcher looks at.

// Field is the object field a shard selector hashes.
type Field uint8

// The fields, and how many there are.
const (
	ByUID Field = iota
	ByNamespace
	Fields
)

// Hashes are an object's hashes, indexed by Field.
type Hashes [Fields]uint64

// The field paths shard selectors name, as k8s.io/apiserver/pkg/sharding parses them.
const (
	UIDPath       = "object.metadata.uid"
	NamespacePath = "object.metadata.namespace"
)

// Hash is the hash shard selectors compare: FNV-1a over 64 bits, as
// sharding.HashField computes it, as a number.
func Hash(value string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(value))
	return h.Sum64()
}

// Range is the hashes from Lo to Hi, both included: a selector's
// [start, end) with end 2^64 at most.
type Range struct{ Lo, Hi uint64 }

// Selector is a shard selector as numbers: the field it hashes and the
// union of its ranges, sorted and disjoint.
type Selector struct {
	Field  Field
	Ranges []Range
	// Text is the selector as the client sent it, for ShardInfo and for
	// grouping watchers with the same selector.
	Text string
}

// Parse converts a parsed selector, or returns an error naming
// what a client must fix. The API's parser accepts only what converts;
// this is for callers of the storage interface that build selectors by hand.
func Parse(sel sharding.Selector) (*Selector, error) {
	reqs := sel.Requirements()
	s := &Selector{Text: sel.String()}
	for i, r := range reqs {
		field, err := parseField(r.Key)
		if err != nil {
			return nil, err
		}
		if i > 0 && field != s.Field {
			return nil, fmt.Errorf("invalid shard selector: all shard ranges must use the same field, got %q and %q", reqs[0].Key, r.Key)
		}
		s.Field = field
		lo, loTop, err := parseBound(r.Start)
		if err != nil {
			return nil, err
		}
		end, endTop, err := parseBound(r.End)
		if err != nil {
			return nil, err
		}
		// [start, end) as [lo, hi]; the end 2^64 is past every hash.
		if loTop || (!endTop && lo >= end) {
			return nil, fmt.Errorf("invalid shard selector: shard range start %s must be less than end %s", r.Start, r.End)
		}
		hi := end - 1
		if endTop {
			hi = math.MaxUint64
		}
		s.Ranges = append(s.Ranges, Range{Lo: lo, Hi: hi})
	}
	s.Ranges = MergeRanges(s.Ranges)
	return s, nil
}

func parseField(path string) (Field, error) {
	switch path {
	case UIDPath:
		return ByUID, nil
	case NamespacePath:
		return ByNamespace, nil
	}
	return 0, fmt.Errorf("invalid shard selector: unsupported field path %q; supported: %s, %s", path, UIDPath, NamespacePath)
}

// parseBound reads a bound: "0x" and 16 hex digits, or top for
// 0x10000000000000000, 2^64, which no uint64 holds.
func parseBound(s string) (v uint64, top bool, err error) {
	if s == "0x10000000000000000" {
		return 0, true, nil
	}
	digits, ok := strings.CutPrefix(s, "0x")
	if ok && len(digits) == 16 {
		if v, err = strconv.ParseUint(digits, 16, 64); err == nil {
			return v, false, nil
		}
	}
	return 0, false, fmt.Errorf("invalid shard selector: bound %q must be '0x' and 16 lowercase hex digits, or 0x10000000000000000", s)
}

// Matches reports whether an object with hashes h falls in one of the ranges.
func (s *Selector) Matches(h *Hashes) bool {
	v := h[s.Field]
	i, _ := slices.BinarySearchFunc(s.Ranges, v, func(r Range, v uint64) int {
		switch {
		case r.Hi < v:
			return -1
		case r.Lo > v:
			return 1
		}
		return 0
	})
	return i < len(s.Ranges) && s.Ranges[i].Lo <= v && v <= s.Ranges[i].Hi
}

// MergeRanges sorts ranges and joins those that overlap or touch.
func MergeRanges(rs []Range) []Range {
	slices.SortFunc(rs, func(a, b Range) int {
		switch {
		case a.Lo < b.Lo:
			return -1
		case a.Lo > b.Lo:
			return 1
		}
		return 0
	})
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1].Hi == math.MaxUint64 || r.Lo <= out[n-1].Hi+1) {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return out
}
