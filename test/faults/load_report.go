package faults

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

// loadResult is what a run under load measured beside a scenario's result.
type loadResult struct {
	cfg loadConfig
	// streams counts the raw streams: single-object, namespace and
	// everything.
	streams int
	// synced is how long the streams took to sync before the traffic,
	// and syncFailures how many of their lists and watches failed then.
	synced       time.Duration
	syncFailures int
	recovery
	// rssBefore is the server's RSS just before the fault; rssAfter once
	// every stream recovered and the writes went on again, rssSettled
	// after that (settledRSS).
	rssBefore, rssAfter int64
	rssSettled          time.Duration
	// writesPerSecond is the object writes a second etcd recorded from
	// the traffic's start to the fault, both writers together.
	writesPerSecond float64
}

// rssRatio is the RSS after recovery over the RSS before the fault.
func (l *loadResult) rssRatio() float64 {
	if l.rssBefore == 0 {
		return 0
	}
	return float64(l.rssAfter) / float64(l.rssBefore)
}

// summary is the load's line of a result for the test log.
func (l *loadResult) summary() string {
	return fmt.Sprintf("load: %d streams (%d single-object, %d namespaces, %d on everything, %d slow), synced in %v (%d failed opens); %.0f object writes/s before the fault; "+
		"recovered %d, not %d: p50 %v p99 %v max %v after the heal; sentinels committed by %v, delivered p50 %v p99 %v after their commit; "+
		"server RSS %d MiB before the fault, %d MiB after recovery (%.2f×, %v after it)",
		l.streams, l.cfg.objects, l.cfg.namespaces, l.cfg.everything, l.cfg.slow, l.synced.Round(time.Second), l.syncFailures, l.writesPerSecond,
		len(l.after), l.unrecovered, round(percentile(l.after, 0.5)), round(percentile(l.after, 0.99)), round(percentile(l.after, 1)),
		round(l.committed), round(percentile(l.delivery, 0.5)), round(percentile(l.delivery, 0.99)),
		l.rssBefore>>20, l.rssAfter>>20, l.rssRatio(), l.rssSettled.Round(100*time.Millisecond))
}

// writeLoadTable prints the runs under load of results as a Markdown
// table, one row per scenario and server: counts summed over repeated
// runs, times and ratios as the median with the range.
func writeLoadTable(w io.Writer, results []*result) {
	type key struct{ scenario, server string }
	var order []key
	groups := map[key][]*result{}
	for _, r := range results {
		if r.load == nil {
			continue
		}
		k := key{r.scenario, r.server}
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	if len(order) == 0 {
		return
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].scenario < order[j].scenario })
	fmt.Fprintln(w, "\n| under load | server | runs | streams | writes/s | violations | ended 410/error/closed | client re-lists | not recovered | recovery p50 | recovery p99 | recovery max | sentinels committed by | delivery p99 | RSS before, MiB | RSS after, MiB | RSS after ÷ before | RSS after, s after recovery |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, k := range order {
		g := groups[k]
		var violations, ended410, endedError, endedClosed, relists, unrecovered int
		var p50, p99, pmax, committed, delivery []time.Duration
		var streams, rate, before, after, ratio, settled []float64
		for _, r := range g {
			l := r.load
			violations += r.Total()
			ended410 += r.ended410
			endedError += r.endedError
			endedClosed += r.endedClosed
			relists += r.relists
			unrecovered += l.unrecovered
			p50 = append(p50, percentile(l.after, 0.5))
			p99 = append(p99, percentile(l.after, 0.99))
			pmax = append(pmax, percentile(l.after, 1))
			committed = append(committed, l.committed)
			delivery = append(delivery, percentile(l.delivery, 0.99))
			streams = append(streams, float64(l.streams))
			rate = append(rate, l.writesPerSecond)
			before = append(before, float64(l.rssBefore>>20))
			after = append(after, float64(l.rssAfter>>20))
			ratio = append(ratio, l.rssRatio())
			settled = append(settled, l.rssSettled.Seconds())
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %d | %d/%d/%d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			k.scenario, k.server, len(g), spreadOf(streams, "%.0f"), spreadOf(rate, "%.0f"), violations,
			ended410, endedError, endedClosed, relists, unrecovered, spread(p50), spread(p99), spread(pmax),
			spread(committed), spread(delivery), spreadOf(before, "%.0f"), spreadOf(after, "%.0f"), spreadOf(ratio, "%.2f"),
			spreadOf(settled, "%.1f"))
	}
}

// spreadOf is spread for numbers, each printed with format.
func spreadOf(xs []float64, format string) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	median := fmt.Sprintf(format, s[len(s)/2])
	if len(s) == 1 || s[0] == s[len(s)-1] {
		return median
	}
	return fmt.Sprintf("%s (%s–%s)", median, fmt.Sprintf(format, s[0]), fmt.Sprintf(format, s[len(s)-1]))
}

// loadName is the scenario's name in the tables when it runs under load.
func loadName(sc scenario, cfg loadConfig) string {
	return fmt.Sprintf("%s, %s streams", sc.name, thousands(cfg.objects+cfg.namespaces+cfg.everything))
}

// thousands prints n with commas, as the docs write counts.
func thousands(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
