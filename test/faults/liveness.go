package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cached-apiserver/cached-apiserver/internal/watchcheck"
)

// Liveness after a fault's heal, over HTTP, beside the safety that
// validate checks against etcd's history: watches from resourceVersions
// the clients were handed before the fault are served again, lists and
// /readyz answer again, within a deadline.
const (
	// livenessRVs is how many handed resourceVersions are watched from.
	livenessRVs = 8
	// etcdHealthyFor, freshnessTimeout and livenessSlack make the
	// deadline: 10 s of etcd answering after the heal, then the cache's
	// freshness timeout (cacher.DefaultFreshnessTimeout, upstream's 3 s),
	// within which a watch waiting for a backfill is answered, and 5 s for
	// its client to retry.
	etcdHealthyFor   = 10 * time.Second
	freshnessTimeout = 3 * time.Second
	livenessSlack    = 5 * time.Second
	// livenessEvery is how often a resourceVersion is watched from until
	// it is served.
	livenessEvery = time.Second
	// livenessAttemptTimeout bounds one watch: a watch that waits for a
	// backfill gets 429 after the freshness timeout.
	livenessAttemptTimeout = 5 * time.Second
	// warmStartReach is how many revisions back ours' warm start replays:
	// cacher.DefaultWarmStartRevisions, which the harness's servers run with.
	warmStartReach = 10_000
	// floorMetric is ours' floor: a watch from below it gets 410.
	floorMetric = "cached_apiserver_watch_cache_floor_resource_version"
)

// handedRV is a resourceVersion a client was handed before the fault.
type handedRV struct {
	rv int64
	// beforeRestart is whether it was handed before the server's last
	// restart: upstream's cache, which does not backfill, answers 410 to it.
	beforeRestart bool
}

// livenessResult is what checkLiveness found.
type livenessResult struct {
	watchcheck.Violations
	notes, harnessErrors []string
}

// rvWatch is what the watches from one handed resourceVersion got.
type rvWatch struct {
	handedRV
	// answers counts the answers by kind.
	answers map[answerKind]int
	last    string
	// served is when the first served watch's first event came, after the
	// heal, and first that event; zero if none.
	served time.Duration
	first  watchcheck.Item
	// gone is when a 410 came that ended the tries, and judged why it was
	// or was not one the server may give.
	gone      time.Duration
	judged    string
	violation bool
}

// checkLiveness watches from each of rvs every livenessEvery from healed
// until it is served or answered with a 410 the server may give, and
// lists and asks /readyz until each answers 200, all until the deadline:
// healed + etcdHealthyFor + freshnessTimeout + livenessSlack. What is not
// served or answered by then, and every 410 the server may not give, is a
// Liveness violation; a watch whose first event is not the first change
// after its resourceVersion in etcd's history is a Resumable one.
//
// A 410 is ours' to give only for a resourceVersion below its floor, and
// below where a run without faults has the floor: under etcd's compaction,
// or beyond its warm start's reach. Upstream's cache, which does not
// backfill, may give it for a resourceVersion etcd compacted or handed
// out before the server's restart.
func (e *env) checkLiveness(ctx context.Context, rvs []handedRV, healed time.Time) *livenessResult {
	res := &livenessResult{}
	s := e.servers[0]
	deadline := healed.Add(etcdHealthyFor + freshnessTimeout + livenessSlack)
	var wg sync.WaitGroup
	watches := make([]*rvWatch, len(rvs))
	for i, h := range rvs {
		w := &rvWatch{handedRV: h, answers: map[answerKind]int{}}
		watches[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.watchUntilServed(ctx, s, w, healed, deadline)
		}()
	}
	// Each of these must answer 200 once after the heal, by the deadline.
	checks := []struct {
		name string
		do   func(context.Context) int
	}{
		{"/readyz", s.readyz},
		{"a consistent list", func(ctx context.Context) int { return s.listStatus(ctx, "") }},
		{"a list at resourceVersion 0", func(ctx context.Context) int { return s.listStatus(ctx, "0") }},
	}
	answered := make([]time.Duration, len(checks))
	lastCode := make([]int, len(checks))
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ; time.Now().Before(deadline) && ctx.Err() == nil; hold(ctx, livenessEvery) {
				actx, cancel := context.WithTimeout(ctx, livenessAttemptTimeout)
				lastCode[i] = c.do(actx)
				cancel()
				if lastCode[i] == http.StatusOK {
					answered[i] = time.Since(healed)
					return
				}
			}
		}()
	}
	wg.Wait()

	var times []string
	for i, c := range checks {
		if answered[i] == 0 {
			res.Note(&res.Liveness, "%s did not answer 200 within %v of the heal; last answer %d", c.name,
				deadline.Sub(healed), lastCode[i])
			continue
		}
		times = append(times, fmt.Sprintf("%s at %+.2fs", c.name, answered[i].Seconds()))
	}
	res.notes = append(res.notes, "after the heal, 200 from "+strings.Join(times, ", "))

	// A served watch's first event, against etcd's history.
	var newest int64
	for _, w := range watches {
		newest = max(newest, w.first.Rev)
	}
	var changes []watchcheck.Change[objState]
	if newest > 0 {
		if err := e.truth.WaitFor(ctx, e.cluster.truthClient, newest, 30*time.Second); err != nil {
			res.harnessErrors = append(res.harnessErrors, fmt.Sprintf("the ground truth never reached %d: %v", newest, err))
		}
		var err error
		if changes, err = e.truth.Changes(); err != nil {
			res.harnessErrors = append(res.harnessErrors, fmt.Sprintf("the ground truth is incomplete: %v", err))
		}
	}
	everything := func(*objState) bool { return true }
	for _, w := range watches {
		where := "after"
		if w.beforeRestart {
			where = "before"
		}
		line := fmt.Sprintf("watch from %d (handed %s the restart): %s", w.rv, where, w.counts())
		switch {
		case w.served > 0:
			line += fmt.Sprintf("; served at %+.2fs, first %s %s at %d", w.served.Seconds(), w.first.Type, w.first.Key, w.first.Rev)
			if want := watchcheck.Expected(changes, everything, w.rv, w.first.Rev); len(want) == 0 || want[0] != w.first {
				res.Note(&res.Resumable, "a watch from %d began with %s %s at %d, want the first change after it in etcd: %v",
					w.rv, w.first.Type, w.first.Key, w.first.Rev, want[:min(1, len(want))])
			}
		case w.gone > 0:
			line += fmt.Sprintf("; 410 at %+.2fs: %s", w.gone.Seconds(), w.judged)
			if w.violation {
				res.Note(&res.Liveness, "a watch from %d, handed %s the restart, got 410 at %+.2fs after the heal: %s",
					w.rv, where, w.gone.Seconds(), w.judged)
			}
		case strings.HasPrefix(w.last, string(answer429)):
			res.Note(&res.Liveness, "watches from %d still got 429 %v after the heal: %s", w.rv, deadline.Sub(healed), w.last)
		default:
			res.Note(&res.Liveness, "no watch from %d was served within %v of the heal; the last got %s", w.rv,
				deadline.Sub(healed), w.last)
		}
		if w.judged != "" && strings.HasPrefix(w.judged, "harness:") {
			res.harnessErrors = append(res.harnessErrors, w.judged)
		}
		res.notes = append(res.notes, line)
	}
	return res
}

// counts says what w's watches got, by kind.
func (w *rvWatch) counts() string {
	var parts []string
	for _, k := range []answerKind{answerServed, answer410, answer429, answerOther, answerWrong} {
		if n := w.answers[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d × %s", n, k))
		}
	}
	return strings.Join(parts, ", ")
}

// watchUntilServed watches from w.rv every livenessEvery until a watch is
// served, or gets a 410, or deadline passes.
func (e *env) watchUntilServed(ctx context.Context, s *apiServer, w *rvWatch, healed, deadline time.Time) {
	for ; time.Now().Before(deadline) && ctx.Err() == nil; hold(ctx, livenessEvery) {
		kind, first, detail := firstEventFrom(ctx, s, w.rv)
		w.answers[kind]++
		w.last = string(kind) + ": " + detail
		switch kind {
		case answerServed:
			w.served, w.first = time.Since(healed), first
			return
		case answer410:
			w.gone = time.Since(healed)
			w.judged, w.violation = e.judge410(ctx, s, w.handedRV)
			return
		}
	}
}

// judge410 says whether s may answer 410 to a watch from h, and why.
func (e *env) judge410(ctx context.Context, s *apiServer, h handedRV) (string, bool) {
	holds, err := e.etcdHolds(ctx, h.rv)
	if err != nil {
		return fmt.Sprintf("harness: reading etcd at %d: %v", h.rv, err), false
	}
	if s.impl != ours {
		switch {
		case !holds:
			return "etcd compacted it", false
		case h.beforeRestart:
			return "the server restarted after it was handed out", false
		}
		return "etcd holds it, and it was handed out by the server as it runs now", true
	}
	floor, err := s.metric(ctx, floorMetric, `resource="assignments"`)
	if err != nil {
		return fmt.Sprintf("harness: reading the floor: %v", err), false
	}
	head, err := e.cluster.head(ctx)
	if err != nil {
		return fmt.Sprintf("harness: reading etcd's head: %v", err), false
	}
	reach := max(head-warmStartReach, 1)
	switch {
	case h.rv >= int64(floor):
		return fmt.Sprintf("at or above the server's floor %.0f", floor), true
	case holds && h.rv >= reach:
		return fmt.Sprintf("below the server's floor %.0f, but etcd holds it and a warm start reaches back to %d: a run without faults has the floor at or below it",
			floor, reach), true
	case !holds:
		return fmt.Sprintf("below the server's floor %.0f; etcd compacted it", floor), false
	}
	return fmt.Sprintf("below the server's floor %.0f, beyond a warm start's reach (%d)", floor, reach), false
}

// etcdHolds tells whether etcd still serves its state at rev.
func (e *env) etcdHolds(ctx context.Context, rev int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := e.cluster.client.Get(ctx, etcdPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithLimit(1),
		clientv3.WithKeysOnly())
	if errors.Is(err, rpctypes.ErrCompacted) {
		return false, nil
	}
	return err == nil, err
}

// answerKind is what one raw watch got first.
type answerKind string

const (
	// answerServed is a watch whose first event came (and, for a watch
	// from H0, was the first write after it).
	answerServed answerKind = "served"
	answer410    answerKind = "410"
	answer429    answerKind = "429"
	// answerWrong is a watch whose first event is another one.
	answerWrong answerKind = "wrong first event"
	// answerOther is any other error, or no event within the attempt's time.
	answerOther answerKind = "other"
)

// firstEventFrom watches every assignment from rv once, without retries
// or client-go's backoff, for up to livenessAttemptTimeout, and says what
// the server sent first: answerServed with the event, answer410,
// answer429, or answerOther.
func firstEventFrom(ctx context.Context, s *apiServer, rv int64) (answerKind, watchcheck.Item, string) {
	ctx, cancel := context.WithTimeout(ctx, livenessAttemptTimeout)
	defer cancel()
	body, err := s.raw.Get().AbsPath("/apis/fleet.example.com/v1beta1/assignments").
		Param("watch", "1").Param("resourceVersion", strconv.FormatInt(rv, 10)).MaxRetries(0).Stream(ctx)
	if err != nil {
		return statusKind(codeOf(err)), watchcheck.Item{}, err.Error()
	}
	defer body.Close()
	line, err := bufio.NewReader(body).ReadBytes('\n')
	if err != nil {
		return answerOther, watchcheck.Item{}, fmt.Sprintf("no event within %v: %v", livenessAttemptTimeout, err)
	}
	var ev struct {
		Type   string `json:"type"`
		Object struct {
			Code     int32  `json:"code"`
			Message  string `json:"message"`
			Metadata struct {
				Name, Namespace, ResourceVersion string
			} `json:"metadata"`
		} `json:"object"`
	}
	if err := json.Unmarshal(line, &ev); err != nil {
		return answerOther, watchcheck.Item{}, fmt.Sprintf("undecodable event %q: %v", line, err)
	}
	if ev.Type == string(watch.Error) {
		return statusKind(ev.Object.Code), watchcheck.Item{}, fmt.Sprintf("ERROR event %d: %s", ev.Object.Code, ev.Object.Message)
	}
	m := ev.Object.Metadata
	it := watchcheck.Item{Type: watch.EventType(ev.Type), Key: m.Namespace + "/" + m.Name, Rev: parseRV(m.ResourceVersion)}
	return answerServed, it, fmt.Sprintf("%s %s at %d", it.Type, it.Key, it.Rev)
}

// codeOf is the HTTP status of a request's error, 0 if it has none.
func codeOf(err error) int32 {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Code
	}
	return 0
}

// statusKind is the answer an HTTP status stands for.
func statusKind(code int32) answerKind {
	switch code {
	case http.StatusGone:
		return answer410
	case http.StatusTooManyRequests:
		return answer429
	}
	return answerOther
}

// listStatus lists one assignment at rv ("" for a consistent list), once,
// without retries, and returns the status code, 0 if none came.
func (s *apiServer) listStatus(ctx context.Context, rv string) int {
	req := s.raw.Get().AbsPath("/apis/fleet.example.com/v1beta1/assignments").Param("limit", "1").MaxRetries(0)
	if rv != "" {
		req = req.Param("resourceVersion", rv)
	}
	var code int
	req.Do(ctx).StatusCode(&code)
	return code
}
