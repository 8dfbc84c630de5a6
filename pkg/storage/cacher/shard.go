package cacher

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/sharding"
)

// Sharded list and watch (KEP-5866, the ShardedListAndWatch feature gate)
// select objects by the 64-bit FNV-1a hash of their UID or namespace. The
// cache hashes both once per object version, at ingest, and compares
// numbers; upstream resolves the field and formats the hash as hex for
// every object a sharded list or watcher looks at.

// shardField is the object field a shard selector hashes.
type shardField uint8

const (
	shardByUID shardField = iota
	shardByNamespace
	shardFields
)

// The field paths shard selectors name, as k8s.io/apiserver/pkg/sharding parses them.
const (
	shardUIDPath       = "object.metadata.uid"
	shardNamespacePath = "object.metadata.namespace"
)

// shardHash is the hash shard selectors compare: FNV-1a over 64 bits, as
// sharding.HashField computes it, as a number.
func shardHash(value string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(value))
	return h.Sum64()
}

// hashRange is the hashes from lo to hi, both included: a selector's
// [start, end) with end 2^64 at most.
type hashRange struct{ lo, hi uint64 }

// shardRanges is a shard selector as numbers: the field it hashes and the
// union of its ranges, sorted and disjoint.
type shardRanges struct {
	field  shardField
	ranges []hashRange
	// selector is the selector as the client sent it, for ShardInfo and
	// for grouping watchers with the same selector.
	selector string
}

// newShardRanges converts a parsed selector, or returns an error naming
// what a client must fix. The API's parser accepts only what converts;
// this is for callers of the storage interface that build selectors by hand.
func newShardRanges(sel sharding.Selector) (*shardRanges, error) {
	reqs := sel.Requirements()
	s := &shardRanges{selector: sel.String()}
	for i, r := range reqs {
		field, err := parseShardField(r.Key)
		if err != nil {
			return nil, err
		}
		if i > 0 && field != s.field {
			return nil, fmt.Errorf("invalid shard selector: all shard ranges must use the same field, got %q and %q", reqs[0].Key, r.Key)
		}
		s.field = field
		lo, loTop, err := parseShardBound(r.Start)
		if err != nil {
			return nil, err
		}
		end, endTop, err := parseShardBound(r.End)
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
		s.ranges = append(s.ranges, hashRange{lo: lo, hi: hi})
	}
	s.ranges = mergeRanges(s.ranges)
	return s, nil
}

func parseShardField(path string) (shardField, error) {
	switch path {
	case shardUIDPath:
		return shardByUID, nil
	case shardNamespacePath:
		return shardByNamespace, nil
	}
	return 0, fmt.Errorf("invalid shard selector: unsupported field path %q; supported: %s, %s", path, shardUIDPath, shardNamespacePath)
}

// parseShardBound reads a bound: "0x" and 16 hex digits, or top for
// 0x10000000000000000, 2^64, which no uint64 holds.
func parseShardBound(s string) (v uint64, top bool, err error) {
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

// matches reports whether an object with hashes h falls in one of the ranges.
func (s *shardRanges) matches(h *[shardFields]uint64) bool {
	v := h[s.field]
	i, _ := slices.BinarySearchFunc(s.ranges, v, func(r hashRange, v uint64) int {
		switch {
		case r.hi < v:
			return -1
		case r.lo > v:
			return 1
		}
		return 0
	})
	return i < len(s.ranges) && s.ranges[i].lo <= v && v <= s.ranges[i].hi
}

// mergeRanges sorts ranges and joins those that overlap or touch.
func mergeRanges(rs []hashRange) []hashRange {
	slices.SortFunc(rs, func(a, b hashRange) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1].hi == math.MaxUint64 || r.lo <= out[n-1].hi+1) {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}
