//go:build faultinject

package inject

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// current is the fault injected: the environment's, or what Set set.
var current atomic.Pointer[Fault]

// FailpointsEnv arms failpoints in a faultinject build, as
// "point=kind[(sleep)][@prob][*count]" separated by commas, e.g.
// "replay=sleep(20s)*1,list-page-before=error@0.5".
const FailpointsEnv = FailpointsEnvName

func init() {
	f := Fault(os.Getenv(Env))
	current.Store(&f)
	if spec := os.Getenv(FailpointsEnv); spec != "" {
		armed, err := ParseFailpoints(spec)
		if err != nil {
			panic(fmt.Sprintf("%s=%q: %v", FailpointsEnv, spec, err))
		}
		for p, a := range armed {
			Arm(p, a)
		}
	}
}

// Enabled is whether this build has failpoints.
const Enabled = true

// On reports whether fault f is injected.
func On(f Fault) bool { return *current.Load() == f }

// Set injects f, for a test in this build, and returns what undoes it.
func Set(f Fault) (restore func()) {
	old := current.Swap(&f)
	return func() { current.Store(old) }
}

// Current is the fault injected, "" if none.
func Current() Fault { return *current.Load() }

// failpoints holds the armed failpoints.
var failpoints struct {
	// mu guards everything below.
	mu    sync.Mutex
	armed map[Point]Action
	fired map[Point]int
	rnd   *rand.Rand
	// disarmed is closed by DisarmAll, ending every sleep under way.
	disarmed chan struct{}
}

// Arm arms p with a, replacing what it had, and returns what disarms it.
func Arm(p Point, a Action) (disarm func()) {
	failpoints.mu.Lock()
	defer failpoints.mu.Unlock()
	if failpoints.armed == nil {
		failpoints.armed, failpoints.fired = map[Point]Action{}, map[Point]int{}
		failpoints.rnd = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
		failpoints.disarmed = make(chan struct{})
	}
	failpoints.armed[p] = a
	failpoints.fired[p] = 0
	return func() { Disarm(p) }
}

// Disarm disarms p.
func Disarm(p Point) {
	failpoints.mu.Lock()
	defer failpoints.mu.Unlock()
	delete(failpoints.armed, p)
}

// DisarmAll disarms every failpoint, and ends the sleeps under way: a
// test's faults are over when it says so.
func DisarmAll() {
	failpoints.mu.Lock()
	defer failpoints.mu.Unlock()
	clear(failpoints.armed)
	if failpoints.disarmed != nil {
		close(failpoints.disarmed)
		failpoints.disarmed = make(chan struct{})
	}
}

// Fired returns how often p fired since it was armed.
func Fired(p Point) int {
	failpoints.mu.Lock()
	defer failpoints.mu.Unlock()
	return failpoints.fired[p]
}

// Hit is failpoint p: if armed, and its chance and count allow, it acts:
// it sleeps (until ctx ends), or returns ErrFailpoint, ErrEndWatch or
// ErrRepeat for its caller to act on.
func Hit(ctx context.Context, p Point) error {
	failpoints.mu.Lock()
	a, ok := failpoints.armed[p]
	fire := ok && (a.Count == 0 || failpoints.fired[p] < a.Count) && (a.Prob <= 0 || failpoints.rnd.Float64() < a.Prob)
	if fire {
		failpoints.fired[p]++
	}
	disarmed := failpoints.disarmed
	failpoints.mu.Unlock()
	if !fire {
		return nil
	}
	switch a.Kind {
	case Sleep:
		d := a.Sleep
		if p == ApplyAppend {
			d = min(d, MaxSleep)
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-disarmed:
		}
		return nil
	case Fail:
		return ErrFailpoint
	case EndWatch:
		return ErrEndWatch
	case Repeat:
		return ErrRepeat
	case Stall:
		return ErrStall
	case Mismatch:
		return ErrMismatch
	}
	return nil
}

// ParseFailpoints reads FailpointsEnv's syntax.
func ParseFailpoints(spec string) (map[Point]Action, error) {
	out := map[Point]Action{}
	for _, item := range strings.Split(spec, ",") {
		name, act, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want point=action", item)
		}
		p := Point(name)
		if !slices.Contains(Points, p) {
			return nil, fmt.Errorf("unknown failpoint %q: want one of %v", name, Points)
		}
		var a Action
		var err error
		if rest, count, ok := strings.Cut(act, "*"); ok {
			if a.Count, err = strconv.Atoi(count); err != nil {
				return nil, fmt.Errorf("%q: count: %v", item, err)
			}
			act = rest
		}
		if rest, prob, ok := strings.Cut(act, "@"); ok {
			if a.Prob, err = strconv.ParseFloat(prob, 64); err != nil {
				return nil, fmt.Errorf("%q: probability: %v", item, err)
			}
			act = rest
		}
		kind, arg, _ := strings.Cut(strings.TrimSuffix(act, ")"), "(")
		a.Kind = Kind(kind)
		switch a.Kind {
		case Sleep:
			if a.Sleep, err = time.ParseDuration(arg); err != nil {
				return nil, fmt.Errorf("%q: sleep: %v", item, err)
			}
		case Fail, EndWatch, Repeat, Stall, Mismatch:
		default:
			return nil, fmt.Errorf("%q: unknown action %q: want sleep(d), error, end-watch, repeat, stall or mismatch", item, kind)
		}
		out[p] = a
	}
	return out, nil
}
