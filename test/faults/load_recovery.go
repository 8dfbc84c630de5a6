package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
)

// loadRecoveryDeadline is how long after the heal every stream of the
// load gets to receive a write made after it: the test's own client
// decodes every sentinel for each stream of everything, 280,000 events at
// 20,000 streams, on the two cores the servers use.
const loadRecoveryDeadline = 2 * time.Minute

// recovery is what the load's sentinels measured.
type recovery struct {
	// after is, per stream recovered, how long after the heal it received
	// a write made after the heal.
	after []time.Duration
	// delivery is, per single-object stream recovered by its sentinel's
	// event, from the sentinel's commit to its arrival.
	delivery []time.Duration
	// committed is how long after the heal the last sentinel committed.
	committed time.Duration
	// unrecovered counts the streams that did not recover; missing
	// describes the first few, with their history.
	unrecovered int
	missing     []string
}

// loadSentinels puts every object of the load again right after the
// heal, straight into etcd, so that each single-object stream has a write
// made after the heal to receive, and waits until every stream received a
// write made after the heal, or until loadRecoveryDeadline. head is etcd's
// revision at the heal: a write above it was made after.
func (e *env) loadSentinels(ctx context.Context, keys []string, head int64, healed time.Time) (*recovery, error) {
	values, err := e.txns.values(keys)
	if err != nil {
		return nil, err
	}
	commits, err := putAll(ctx, e.cluster.client, keys, values, time.Minute)
	if err != nil {
		return nil, fmt.Errorf("the sentinels: %w", err)
	}
	rec := &recovery{}
	for _, c := range commits {
		e.writer.ack(c.rev)
		rec.committed = max(rec.committed, c.at.Sub(healed))
	}
	// A stream's state from a list or watch-list holds a write made after
	// the heal once it is at or past the first sentinel of its selector.
	firstIn := map[selector]int64{}
	for key, c := range commits {
		ns, name, _ := strings.Cut(key, "/")
		for _, sel := range []selector{nameSelector(ns, name), {namespace: ns}, {}} {
			if r, ok := firstIn[sel]; !ok || c.rev < r {
				firstIn[sel] = c.rev
			}
		}
	}
	at := make([]time.Time, len(e.streams))
	pending := func() int {
		n := 0
		for i, s := range e.streams {
			if at[i].IsZero() {
				at[i] = s.recoveredAt(head, firstIn[s.spec.sel])
			}
			if at[i].IsZero() {
				n++
			}
		}
		return n
	}
	deadline := healed.Add(loadRecoveryDeadline)
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Until(deadline), true, func(context.Context) (bool, error) {
		return pending() == 0, nil
	})
	pending()
	for i, s := range e.streams {
		if at[i].IsZero() {
			rec.unrecovered++
			if len(rec.missing) < maxMissing {
				rec.missing = append(rec.missing, fmt.Sprintf("%s: %s", s.spec.name, s.history(healed)))
			}
			continue
		}
		rec.after = append(rec.after, at[i].Sub(healed))
		if key, ok := s.spec.sel.keyOf(); ok {
			if c, ok := commits[key]; ok && s.receivedAt(key, c.rev) == at[i] {
				rec.delivery = append(rec.delivery, at[i].Sub(c.at))
			}
		}
	}
	slices.Sort(rec.after)
	slices.Sort(rec.delivery)
	return rec, nil
}

// maxMissing bounds the streams a recovery describes.
const maxMissing = 10

// recoveredAt returns when s first received a write made after head: an
// event above it, or a list's or a watch-list's state at or past
// first, the first such write of its selector; zero if it has not.
func (s *stream) recoveredAt(head, first int64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, seg := range s.segments {
		if !seg.synced.IsZero() && first > 0 && seg.from >= first {
			return seg.synced
		}
		for _, ev := range seg.events {
			if ev.typ != watch.Bookmark && ev.rv > head {
				return ev.at
			}
		}
	}
	return time.Time{}
}

// receivedAt returns when s received key's event at rev, zero if it did not.
func (s *stream) receivedAt(key string, rev int64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, seg := range s.segments {
		for _, ev := range seg.events {
			if ev.key == key && ev.rv == rev {
				return ev.at
			}
		}
	}
	return time.Time{}
}

// percentile returns the q-quantile of the sorted ds, 0 if there are none.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}
