package history

import (
	"cmp"
	"slices"
	"testing"
	"time"
)

// entry is a test event: a resourceVersion, a time and a size.
type entry struct {
	rv   uint64
	at   time.Time
	size int64
}

func (e *entry) RV() uint64          { return e.rv }
func (e *entry) Recorded() time.Time { return e.at }
func (e *entry) Size() int64         { return e.size }

func ev(rv uint64, at time.Time) *entry { return &entry{rv: rv, at: at} }

func newLog(window time.Duration, minSize, maxSize int, budget int64) *Log[*entry] {
	return New[*entry](Config{Window: window, MinSize: minSize, MaxSize: maxSize, Budget: budget})
}

func rvs(events []*entry) []uint64 {
	out := make([]uint64, len(events))
	for i, e := range events {
		out[i] = e.rv
	}
	return out
}

func TestLog(t *testing.T) {
	start := time.Unix(1000, 0)
	tests := []struct {
		name         string
		min, max     int
		window       time.Duration
		appends      []time.Duration // offsets from start; rv is index+11
		since        uint64          // argument of after
		wantEvents   []uint64
		wantOK       bool
		wantCapacity int
		wantSince    uint64
	}{
		{
			name: "empty log serves its start", min: 4, max: 8, window: time.Minute,
			since: 10, wantEvents: nil, wantOK: true, wantCapacity: 4, wantSince: 10,
		},
		{
			name: "after returns newer events in order", min: 4, max: 8, window: time.Minute,
			appends: []time.Duration{0, 1, 2}, since: 11, wantEvents: []uint64{12, 13}, wantOK: true, wantCapacity: 4, wantSince: 10,
		},
		{
			name: "grows while the oldest event is in the window", min: 2, max: 8, window: time.Minute,
			appends: []time.Duration{0, 1, 2, 3, 4}, since: 10, wantEvents: []uint64{11, 12, 13, 14, 15}, wantOK: true,
			wantCapacity: 8, wantSince: 10,
		},
		{
			name: "wraps around at the maximum and reports too old", min: 2, max: 4, window: time.Minute,
			appends: []time.Duration{0, 1, 2, 3, 4, 5}, since: 11, wantOK: false, wantCapacity: 4, wantSince: 12,
		},
		{
			name: "serves from the new start after wrapping", min: 2, max: 4, window: time.Minute,
			appends: []time.Duration{0, 1, 2, 3, 4, 5}, since: 12, wantEvents: []uint64{13, 14, 15, 16}, wantOK: true,
			wantCapacity: 4, wantSince: 12,
		},
		{
			name: "does not grow past the window", min: 2, max: 8, window: time.Second,
			appends: []time.Duration{0, 10 * time.Second, 20 * time.Second}, since: 12, wantEvents: []uint64{13}, wantOK: true,
			wantCapacity: 2, wantSince: 11,
		},
		{
			name: "shrinks when most events are outside the window", min: 2, max: 16, window: 5 * time.Second,
			// Eight events in a burst grow the ring to 8; a later event, with
			// only itself inside the window, halves it.
			appends: []time.Duration{0, 0, 0, 0, 0, 0, 0, 0, time.Minute}, since: 17, wantEvents: []uint64{18, 19}, wantOK: true,
			wantCapacity: 4, wantSince: 11,
		},
		{
			name: "keeps its size while a quarter is inside the window", min: 2, max: 16, window: 5 * time.Second,
			// The ninth event finds the ring full, its oldest outside the
			// window, and two of eight (a quarter) inside: it drops the oldest.
			appends: []time.Duration{0, 0, 0, 0, 0, 0, 59 * time.Second, 59 * time.Second, time.Minute}, since: 17,
			wantEvents: []uint64{18, 19}, wantOK: true, wantCapacity: 8, wantSince: 11,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLog(tc.window, tc.min, tc.max, 0)
			l.Reset(10)
			for i, off := range tc.appends {
				l.Append(ev(uint64(i+11), start.Add(off)))
			}
			events, _, ok := l.After(At(tc.since), 100)
			if ok != tc.wantOK {
				t.Fatalf("after(%d) ok = %v, want %v", tc.since, ok, tc.wantOK)
			}
			if got := rvs(events); !slices.Equal(got, tc.wantEvents) {
				t.Fatalf("after(%d) = %v, want %v", tc.since, got, tc.wantEvents)
			}
			if l.Capacity() != tc.wantCapacity {
				t.Errorf("capacity = %d, want %d", l.Capacity(), tc.wantCapacity)
			}
			if since, _ := l.Bounds(); since < tc.wantSince {
				t.Errorf("since = %d, want at least %d", since, tc.wantSince)
			}
		})
	}
}

func TestLogAfterLimitAndProgress(t *testing.T) {
	l := newLog(time.Minute, 4, 4, 0)
	l.Reset(5)
	l.Advance(9)
	// Progress moves the head and leaves the floor: a watch from 5, a
	// list's resourceVersion, must still be served (issue 56).
	if since, head := l.Bounds(); since != 5 || head != 9 {
		t.Fatalf("progress on an empty log: since=%d head=%d, want 5 9", since, head)
	}
	if events, _, ok := l.After(At(5), 10); !ok || len(events) != 0 {
		t.Fatalf("after(5) on an empty log past progress: %v %v, want nothing and ok", rvs(events), ok)
	}
	now := time.Now()
	for rv := uint64(10); rv <= 12; rv++ {
		l.Append(ev(rv, now))
	}
	l.Advance(20)
	if since, head := l.Bounds(); since != 5 || head != 20 {
		t.Fatalf("progress with events: since=%d head=%d, want 5 20", since, head)
	}
	if got, next, _ := l.After(At(9), 2); !slices.Equal(rvs(got), []uint64{10, 11}) || next != At(11) {
		t.Fatalf("after with limit 2 = %v, next %v", rvs(got), next)
	}
	l.DropUpTo(11)
	if got, _, ok := l.After(At(11), 10); !ok || !slices.Equal(rvs(got), []uint64{12}) {
		t.Fatalf("after dropUpTo(11): %v %v", rvs(got), ok)
	}
	if _, _, ok := l.After(At(10), 10); ok {
		t.Fatal("a cursor before dropped events must be too old")
	}
}

// sized is an event of bytes.
func sized(rv uint64, at time.Time, bytes int64) *entry { return &entry{rv: rv, at: at, size: bytes} }

func TestLogBudget(t *testing.T) {
	start := time.Now()
	for _, tc := range []struct {
		name   string
		budget int64
		// sizes are appended at rv 11, 12, …, every interval (default 1 s).
		sizes       []int64
		interval    time.Duration
		wantEvents  []uint64
		wantBytes   int64
		wantEvicted uint64
	}{
		{name: "no budget keeps everything", sizes: []int64{4000, 4000, 4000}, wantEvents: []uint64{11, 12, 13}, wantBytes: 12000},
		{name: "under the budget keeps everything", budget: 10000, sizes: []int64{3000, 3000, 3000},
			wantEvents: []uint64{11, 12, 13}, wantBytes: 9000},
		{name: "over the budget drops the oldest, inside the window", budget: 10000, sizes: []int64{4000, 4000, 4000},
			wantEvents: []uint64{12, 13}, wantBytes: 8000, wantEvicted: 1},
		{name: "a big event pushes out several", budget: 10000, sizes: []int64{2000, 2000, 2000, 9000},
			wantEvents: []uint64{14}, wantBytes: 9000, wantEvicted: 3},
		{name: "an event bigger than the budget stays alone", budget: 10000, sizes: []int64{1000, 50000},
			wantEvents: []uint64{12}, wantBytes: 50000, wantEvicted: 1},
		{name: "events outside the window leave without counting", budget: 10000, interval: 20 * time.Second,
			sizes: []int64{4000, 4000, 4000}, wantEvents: []uint64{12, 13}, wantBytes: 8000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLog(10*time.Second, 4, 64, tc.budget)
			l.Reset(10)
			interval := cmp.Or(tc.interval, time.Second)
			for i, size := range tc.sizes {
				l.Append(sized(uint64(11+i), start.Add(time.Duration(i)*interval), size))
			}
			since, _ := l.Bounds()
			events, _, ok := l.After(At(since), 100)
			if !ok || !slices.Equal(rvs(events), tc.wantEvents) {
				t.Fatalf("events %v (ok %v), want %v", rvs(events), ok, tc.wantEvents)
			}
			if bytes, evicted := l.Usage(); bytes != tc.wantBytes || evicted != tc.wantEvicted {
				t.Errorf("usage = %d bytes, %d evicted; want %d, %d", bytes, evicted, tc.wantBytes, tc.wantEvicted)
			}
			// A watcher from before what the budget removed is too old.
			if len(tc.wantEvents) < len(tc.sizes) {
				if _, _, ok := l.After(At(10), 100); ok {
					t.Error("a cursor before evicted events must be too old")
				}
			}
		})
	}
}

func TestLogPrependBudget(t *testing.T) {
	now := time.Now()
	l := newLog(time.Minute, 4, 64, 10000)
	l.Reset(20)
	generation := l.Resets()
	l.Append(sized(21, now, 5000))
	older := []*entry{sized(11, now, 3000), sized(12, now, 3000), sized(13, now, 2000)}
	if !l.Prepend(older, 10, 20, generation) {
		t.Fatal("prepend refused")
	}
	since, _ := l.Bounds()
	events, _, _ := l.After(At(since), 100)
	if since != 11 || !slices.Equal(rvs(events), []uint64{12, 13, 21}) {
		t.Fatalf("after prepend: since %d, events %v; want since 11, [12 13 21]", since, rvs(events))
	}
	if bytes, _ := l.Usage(); bytes != 10000 {
		t.Errorf("bytes = %d, want 10000", bytes)
	}
}

// revision is n events sharing resourceVersion rv, each of size bytes.
func revision(rv uint64, n int, at time.Time, size int64) []*entry {
	out := make([]*entry, n)
	for i := range out {
		out[i] = &entry{rv: rv, at: at, size: size}
	}
	return out
}

// TestLogRevisions checks that the log keeps revisions whole: a reader
// stopping inside one resumes inside it, and the log evicts, trims and
// prepends whole revisions only (issue 56: several events in one etcd
// revision were lost on live streams).
func TestLogRevisions(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name string
		// minSize and maxSize size the log, budget bounds its bytes.
		minSize, maxSize int
		budget           int64
		// revs are appended in order: rv → events, each of 1,000 bytes.
		revs []struct {
			rv uint64
			n  int
		}
		// from and limit are After's arguments.
		from  Pos
		limit int
		// want is what After returns: resourceVersions, next, ok.
		want     []uint64
		wantNext Pos
		wantOK   bool
		// wantSince is the log's floor, wantLen how many events it holds.
		wantSince uint64
		wantLen   int
	}{
		{name: "a batch that ends inside a revision stops inside it", minSize: 8, maxSize: 8,
			revs: revs(11, 3, 12, 3), from: At(10), limit: 4,
			want: []uint64{11, 11, 11, 12}, wantNext: Pos{RV: 11, N: 1}, wantOK: true, wantSince: 10, wantLen: 6},
		{name: "a reader inside a revision resumes after what it had", minSize: 8, maxSize: 8,
			revs: revs(11, 3, 12, 3), from: Pos{RV: 11, N: 1}, limit: 10,
			want: []uint64{12, 12}, wantNext: At(12), wantOK: true, wantSince: 10, wantLen: 6},
		{name: "a reader at the start of a revision", minSize: 8, maxSize: 8,
			revs: revs(11, 3, 12, 3), from: Pos{RV: 10, N: 2}, limit: 1,
			want: []uint64{11}, wantNext: At(11), wantOK: true, wantSince: 10, wantLen: 6},
		{name: "a full ring drops the oldest revision whole", minSize: 4, maxSize: 4,
			revs: revs(11, 3, 12, 2), from: At(11), limit: 10,
			want: []uint64{12, 12}, wantNext: At(12), wantOK: true, wantSince: 11, wantLen: 2},
		{name: "a reader inside a dropped revision is too old", minSize: 4, maxSize: 4,
			revs: revs(11, 3, 12, 2), from: Pos{RV: 10, N: 1}, limit: 10, wantNext: Pos{RV: 10, N: 1}, wantSince: 11, wantLen: 2},
		{name: "a revision larger than the ring grows it", minSize: 2, maxSize: 2,
			revs: revs(11, 1, 12, 5), from: At(11), limit: 10,
			want: []uint64{12, 12, 12, 12, 12}, wantNext: At(12), wantOK: true, wantSince: 11, wantLen: 5},
		{name: "the budget evicts whole revisions", minSize: 8, maxSize: 8, budget: 4000,
			revs: revs(11, 2, 12, 2, 13, 1), from: At(11), limit: 10,
			want: []uint64{12, 12, 13}, wantNext: At(13), wantOK: true, wantSince: 11, wantLen: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLog(time.Minute, tc.minSize, tc.maxSize, tc.budget)
			l.Reset(10)
			for _, r := range tc.revs {
				l.Append(revision(r.rv, r.n, now, 1000)...)
			}
			got, next, ok := l.After(tc.from, tc.limit)
			if !slices.Equal(rvs(got), tc.want) || next != tc.wantNext || ok != tc.wantOK {
				t.Errorf("After(%v, %d) = %v, %v, %v; want %v, %v, %v", tc.from, tc.limit, rvs(got), next, ok, tc.want, tc.wantNext, tc.wantOK)
			}
			if since, _ := l.Bounds(); since != tc.wantSince || l.Len() != tc.wantLen {
				t.Errorf("since = %d, %d events; want %d, %d", since, l.Len(), tc.wantSince, tc.wantLen)
			}
		})
	}
}

// revs makes TestLogRevisions' revisions from rv, n pairs.
func revs(pairs ...int) []struct {
	rv uint64
	n  int
} {
	var out []struct {
		rv uint64
		n  int
	}
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, struct {
			rv uint64
			n  int
		}{uint64(pairs[i]), pairs[i+1]})
	}
	return out
}

// TestLogPrependWholeRevisions checks that a backfill too large for the
// log keeps whole revisions: the rest of a revision whose first events do
// not fit goes too, and the floor is that revision.
func TestLogPrependWholeRevisions(t *testing.T) {
	now := time.Now()
	l := newLog(time.Minute, 4, 4, 0)
	l.Reset(20)
	generation := l.Resets()
	l.Append(revision(21, 1, now, 1)...)
	older := append(revision(11, 1, now, 1), append(revision(12, 3, now, 1), revision(13, 1, now, 1)...)...)
	if !l.Prepend(older, 10, 20, generation) {
		t.Fatal("prepend refused")
	}
	since, _ := l.Bounds()
	events, _, _ := l.After(At(since), 100)
	if since != 12 || !slices.Equal(rvs(events), []uint64{13, 21}) {
		t.Fatalf("after prepend: since %d, events %v; want since 12, [13 21]", since, rvs(events))
	}
}
