// Command benchtable reads `go test -bench` output and prints, per scenario
// and metric, the median and range of the repeats for each implementation
// and the ratio of ours to upstream's medians, as a Markdown table.
//
// A benchmark's last name segment, or an impl=… segment anywhere in its
// name, names the implementation: ours, upstream or etcd3. The rest of the
// name, without the GOMAXPROCS suffix, names the scenario. Lines that are not benchmark
// results pass through to stderr untouched.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	chartPath := flag.String("chart", "", "also draw ours ÷ upstream for every metric as a PNG at this path")
	chartTitle := flag.String("title", "", "the chart's title")
	flag.Parse()
	t, err := parse(os.Stdin, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	t.write(os.Stdout)
	if *chartPath != "" {
		if err := t.chart(*chartPath, *chartTitle); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable: chart:", err)
			os.Exit(1)
		}
	}
}

// implPattern finds the implementation in a benchmark name: …/ours-2,
// …/impl=ours-2, or …/impl=ours/… where sub-benchmarks follow (as in
// upstream's store benchmarks, which name their own sub-benchmarks).
// A #01 that go test adds to a name run again within one benchmark, as
// BenchmarkWatchListWrites runs its rounds, marks a repeat.
var implPattern = regexp.MustCompile(`/(?:impl=(ours|upstream|etcd3)(?:#\d+)?(?:/|-\d+$|$)|(ours|upstream|etcd3)(?:#\d+)?(?:-\d+)?$)`)

// procsSuffix is the GOMAXPROCS suffix go test appends to a name.
var procsSuffix = regexp.MustCompile(`-\d+$`)

// scenarioAndImpl splits a benchmark name; ok is false when no
// implementation is named.
func scenarioAndImpl(name string) (scenario, impl string, ok bool) {
	m := implPattern.FindStringSubmatch(name)
	if m == nil {
		return "", "", false
	}
	impl = m[1] + m[2]
	i := strings.Index(name, m[0])
	rest := name[i+len(m[0]):]
	scenario = name[:i]
	if rest != "" {
		scenario += "/" + procsSuffix.ReplaceAllString(rest, "")
	}
	return scenario, impl, true
}

// table holds every value, by scenario, metric and implementation, in the
// order scenarios and metrics first appeared.
type table struct {
	scenarios []string
	metrics   map[string][]string
	values    map[key][]float64
}

type key struct{ scenario, metric, impl string }

func parse(r io.Reader, passthrough io.Writer) (*table, error) {
	t := &table{metrics: map[string][]string{}, values: map[key][]float64{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			fmt.Fprintln(passthrough, line)
			continue
		}
		scenario, impl, ok := scenarioAndImpl(fields[0])
		if !ok {
			fmt.Fprintln(passthrough, line)
			continue
		}
		if !slices.Contains(t.scenarios, scenario) {
			t.scenarios = append(t.scenarios, scenario)
		}
		// fields[1] is the iteration count; then value/unit pairs.
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", line, err)
			}
			metric := fields[i+1]
			if metric == "ns/op" {
				continue // the run's wall time, not a result
			}
			if !slices.Contains(t.metrics[scenario], metric) {
				t.metrics[scenario] = append(t.metrics[scenario], metric)
			}
			k := key{scenario, metric, impl}
			t.values[k] = append(t.values[k], v)
		}
	}
	return t, sc.Err()
}

func (t *table) write(w io.Writer) {
	fmt.Fprintln(w, "| scenario | metric | ours: median (min–max) | upstream: median (min–max) | ours ÷ upstream | n |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, s := range t.scenarios {
		for _, m := range t.metrics[s] {
			ours, up := t.values[key{s, m, "ours"}], t.values[key{s, m, "upstream"}]
			ratio := ""
			if len(ours) > 0 && len(up) > 0 && median(up) != 0 {
				ratio = fmt.Sprintf("%.2f×", median(ours)/median(up))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d |\n", strings.TrimPrefix(s, "Benchmark"), m,
				summary(ours), summary(up), ratio, max(len(ours), len(up)))
		}
	}
}

func summary(v []float64) string {
	if len(v) == 0 {
		return ""
	}
	if len(v) == 1 {
		return format(v[0])
	}
	return fmt.Sprintf("%s (%s–%s)", format(median(v)), format(slices.Min(v)), format(slices.Max(v)))
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// format keeps three significant digits, without exponents.
func format(v float64) string {
	switch a := max(v, -v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + " M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + " k"
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}
