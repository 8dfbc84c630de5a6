package source

import (
	"testing"
	"time"
)

// TestSilence checks when a watch is asked for progress and when it is
// silent, tick by tick, with the default 5 s interval (1 s ticks).
func TestSilence(t *testing.T) {
	tests := []struct {
		name string
		// heard says, for each tick from 1 s on, whether the watch heard
		// anything since the previous one.
		heard []bool
		// askAt and silentAt are the ticks (in seconds) that ask for
		// progress and find the watch silent; 0 means none.
		askAt, silentAt int
	}{{
		name:  "events keep it alive",
		heard: []bool{true, true, true, true, true, true, true, true, true, true},
	}, {
		name:     "nothing from the start",
		heard:    []bool{false, false, false, false, false, false, false, false, false, false},
		askAt:    5,
		silentAt: 7,
	}, {
		name:     "the last event at 1 s: silent 8 s after it at most",
		heard:    []bool{true, false, false, false, false, false, false, false, false, false},
		askAt:    6,
		silentAt: 8,
	}, {
		name:  "the progress answer keeps it alive",
		heard: []bool{false, false, false, false, false, true, false, false, false, false},
		askAt: 5,
	}, {
		name:     "an answer after the deadline is too late",
		heard:    []bool{false, false, false, false, false, false, false, true, false, false},
		askAt:    5,
		silentAt: 7,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			s := newSilence(5*time.Second, start) // the cache's default interval
			if s.period() != time.Second {
				t.Fatalf("period %v, want 1s", s.period())
			}
			askAt, silentAt := 0, 0
			for i, heard := range tc.heard {
				sec := i + 1
				ask, silent := s.tick(start.Add(time.Duration(sec)*time.Second), heard)
				if ask && askAt == 0 {
					askAt = sec
				}
				if silent {
					silentAt = sec
					break
				}
			}
			if askAt != tc.askAt || silentAt != tc.silentAt {
				t.Errorf("asked at %d s and silent at %d s, want %d s and %d s", askAt, silentAt, tc.askAt, tc.silentAt)
			}
		})
	}
}
