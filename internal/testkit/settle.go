package testkit

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Settle waits until each of procs has used under 0.05 cores for 5 s, as a
// benchmark waits for the work of an opening to end before it measures,
// for two minutes at most, and returns how long it waited. It fails only
// when a process's CPU cannot be read.
func Settle(ctx context.Context, procs ...*Process) (time.Duration, error) {
	const (
		quiet = 5 * time.Second
		cores = 0.05
	)
	start := time.Now()
	last := make([]time.Duration, len(procs))
	for i, p := range procs {
		var err error
		if last[i], err = p.CPU(); err != nil {
			return 0, err
		}
	}
	quietSince := start
	var readErr error
	_ = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, false, func(context.Context) (bool, error) {
		for i, p := range procs {
			now, err := p.CPU()
			if err != nil {
				readErr = err
				return false, err
			}
			if (now - last[i]).Seconds() > cores {
				quietSince = time.Now()
			}
			last[i] = now
		}
		return time.Since(quietSince) >= quiet, nil
	})
	return time.Since(start), readErr
}
