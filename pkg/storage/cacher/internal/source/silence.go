package source

import "time"

// ConnectionDropper closes connections to etcd that went quiet.
type ConnectionDropper interface {
	// DropQuiet closes every connection to etcd that has received nothing
	// for quiet or longer, and returns how many it closed.
	DropQuiet(quiet time.Duration) int
}

// silenceTicks is how many times per progress request interval the cache
// looks at its etcd watch: detection of a silent watch is that much finer
// than the interval.
const silenceTicks = 5

// silence tells a silent etcd watch from an idle one. A watch that heard
// nothing, no event and no progress notification, for a progress request
// interval is asked for progress; one that still hears nothing two ticks
// later is silent, unless etcd confirms it has nothing newer for it
// (follower.idle). With the default 5 s interval that is at most 8 s after
// the last thing it heard (an interval, one tick for noticing the last
// event, two for the answer), within issue 28's 12 s for a member gone
// silent. etcd answers a progress request on a healthy stream within
// milliseconds; it skips it only while the stream catches up, and then
// events flow.
//
// Only the goroutine running the watch uses it.
type silence struct {
	// interval is the progress request interval.
	interval time.Duration
	// lastHeard is the tick at which the watch was last known to have
	// heard something.
	lastHeard time.Time
	// askedAt is when progress was asked for; zero when it was not.
	askedAt time.Time
}

func newSilence(interval time.Duration, now time.Time) *silence {
	return &silence{interval: interval, lastHeard: now}
}

// period is how often tick must be called.
func (s *silence) period() time.Duration { return s.interval / silenceTicks }

// tick is called every period with whether the watch heard anything since
// the previous call. It says whether to ask etcd for progress now and
// whether the watch is silent.
func (s *silence) tick(now time.Time, heard bool) (ask, silent bool) {
	switch {
	case heard:
		s.lastHeard, s.askedAt = now, time.Time{}
	case s.askedAt.IsZero():
		if now.Sub(s.lastHeard) >= s.interval {
			s.askedAt = now
			return true, false
		}
	case now.Sub(s.askedAt) >= 2*s.period():
		return false, true
	}
	return false, false
}

// idle restarts the count after etcd confirmed, at now, that the watch had
// nothing to hear: a quiet watch of an idle etcd is asked again an
// interval later.
func (s *silence) idle(now time.Time) { s.lastHeard, s.askedAt = now, time.Time{} }

// quiet is how long the watch has heard nothing, as of now.
func (s *silence) quiet(now time.Time) time.Duration { return now.Sub(s.lastHeard) }
