//go:build faultinject

package inject

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestParseFailpoints(t *testing.T) {
	tests := []struct {
		spec    string
		want    map[Point]Action
		wantErr bool
	}{
		{spec: "replay=sleep(20s)*1", want: map[Point]Action{Replay: {Kind: Sleep, Sleep: 20 * time.Second, Count: 1}}},
		{spec: "list-page-before=error@0.5, follower-response=repeat", want: map[Point]Action{
			ListPageBefore: {Kind: Fail, Prob: 0.5}, WatchResponse: {Kind: Repeat}}},
		{spec: "silence-check=end-watch@0.25*3", want: map[Point]Action{SilenceCheck: {Kind: EndWatch, Prob: 0.25, Count: 3}}},
		{spec: "consistency-compare=mismatch*1", want: map[Point]Action{ConsistencyCheck: {Kind: Mismatch, Count: 1}}},
		{spec: "nowhere=error", wantErr: true},
		{spec: "replay=explode", wantErr: true},
		{spec: "replay=sleep(soon)", wantErr: true},
		{spec: "replay", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := ParseFailpoints(tc.spec)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want an error: %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for p, a := range tc.want {
				if got[p] != a {
					t.Errorf("%s: got %+v, want %+v", p, got[p], a)
				}
			}
		})
	}
}

func TestHit(t *testing.T) {
	ctx := context.Background()
	if err := Hit(ctx, Replay); err != nil {
		t.Fatalf("an unarmed point: %v", err)
	}
	disarm := Arm(Replay, Action{Kind: Fail, Count: 2})
	for i, want := range []error{ErrFailpoint, ErrFailpoint, nil} {
		if err := Hit(ctx, Replay); !errors.Is(err, want) && !(err == nil && want == nil) {
			t.Errorf("hit %d: %v, want %v", i, err, want)
		}
	}
	if Fired(Replay) != 2 {
		t.Errorf("fired %d, want 2", Fired(Replay))
	}
	disarm()
	Arm(ListToWatch, Action{Kind: Sleep, Sleep: time.Hour})
	defer DisarmAll()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Hit(cctx, ListToWatch); err != nil {
		t.Errorf("a sleep ended by its context: %v", err)
	}
}
