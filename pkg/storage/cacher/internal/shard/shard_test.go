package shard

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/sharding"
)

// req is one range of a selector on path.
func req(path, start, end string) sharding.ShardRangeRequirement {
	return sharding.ShardRangeRequirement{Key: path, Start: start, End: end}
}

func TestShardRanges(t *testing.T) {
	tests := []struct {
		name    string
		sel     sharding.Selector
		want    []Range
		wantErr bool
	}{
		{name: "whole space", sel: sharding.NewSelector(req(UIDPath, "0x0000000000000000", "0x10000000000000000")),
			want: []Range{{0, math.MaxUint64}}},
		{name: "end excluded", sel: sharding.NewSelector(req(NamespacePath, "0x0000000000000010", "0x0000000000000020")),
			want: []Range{{0x10, 0x1f}}},
		{name: "ORed, merged when touching", sel: sharding.NewSelector(req(UIDPath, "0x0000000000000020", "0x0000000000000030"), req(UIDPath, "0x0000000000000000", "0x0000000000000010"), req(UIDPath, "0x0000000000000010", "0x0000000000000018")),
			want: []Range{{0, 0x17}, {0x20, 0x2f}}},
		{name: "two fields", sel: sharding.NewSelector(
			sharding.ShardRangeRequirement{Key: UIDPath, Start: "0x0000000000000000", End: "0x0000000000000001"},
			sharding.ShardRangeRequirement{Key: NamespacePath, Start: "0x0000000000000000", End: "0x0000000000000001"}),
			wantErr: true},
		{name: "unknown field", sel: sharding.NewSelector(req("object.metadata.name", "0x0000000000000000", "0x0000000000000001")), wantErr: true},
		{name: "short bound", sel: sharding.NewSelector(req(UIDPath, "0x0", "0x0000000000000001")), wantErr: true},
		{name: "empty range", sel: sharding.NewSelector(req(UIDPath, "0x0000000000000001", "0x0000000000000001")), wantErr: true},
		{name: "start at the top", sel: sharding.NewSelector(req(UIDPath, "0x10000000000000000", "0x10000000000000000")), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.sel)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want an error: %v", err, tc.wantErr)
			}
			if err == nil && !slices.Equal(got.Ranges, tc.want) {
				t.Fatalf("ranges %x, want %x", got.Ranges, tc.want)
			}
		})
	}
}

// TestShardHashMatchesUpstream checks that the hashes compared as numbers
// select what upstream's selector selects from their hex form.
func TestShardHashMatchesUpstream(t *testing.T) {
	for _, v := range []string{"", "ns", "0f7c1c1e-8d4e-4a53-9b2b-7d1f2a3c4b5d", "ü"} {
		if got, want := fmt.Sprintf("%016x", Hash(v)), sharding.HashField(v); got != want {
			t.Errorf("hash of %q: %s, upstream's %s", v, got, want)
		}
	}
}

func TestMatches(t *testing.T) {
	s := &Selector{Field: ByNamespace, Ranges: []Range{{Lo: 0x10, Hi: 0x1f}, {Lo: 0x40, Hi: math.MaxUint64}}}
	for _, tc := range []struct {
		ns   uint64
		want bool
	}{
		{0x0f, false}, {0x10, true}, {0x1f, true}, {0x20, false}, {0x3f, false}, {0x40, true}, {math.MaxUint64, true},
	} {
		// The UID's hash is the opposite of the namespace's: only the
		// selector's field counts.
		h := Hashes{ByUID: ^tc.ns, ByNamespace: tc.ns}
		if got := s.Matches(&h); got != tc.want {
			t.Errorf("Matches(namespace hash %#x) = %v, want %v", tc.ns, got, tc.want)
		}
	}
}
