// Command promql parses the PromQL of a Prometheus rule file and of a
// Grafana dashboard with Prometheus' own parser (the rule file through
// Prometheus' rule file loader, which validates the rules too), and
// prints every metric name they select, one per line, sorted. It exits 1
// if anything does not parse. TestMonitoringMetricsExist runs it against
// artifacts/monitoring and checks each name on a running server.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	rules := flag.String("rules", "", "a Prometheus rule file")
	dashboard := flag.String("dashboard", "", "a Grafana dashboard's JSON")
	flag.Parse()
	names, err := metricNames(*rules, *dashboard)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, n := range names {
		fmt.Println(n)
	}
}

// metricNames returns the sorted metric names the expressions of both
// files select.
func metricNames(rulesFile, dashboardFile string) ([]string, error) {
	p := parser.NewParser(parser.Options{})
	var exprs []string
	if rulesFile != "" {
		groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
		if len(errs) > 0 {
			return nil, fmt.Errorf("%s: %v", rulesFile, errs)
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				exprs = append(exprs, r.Expr)
			}
		}
	}
	if dashboardFile != "" {
		data, err := os.ReadFile(dashboardFile)
		if err != nil {
			return nil, err
		}
		var dash any
		if err := json.Unmarshal(data, &dash); err != nil {
			return nil, fmt.Errorf("%s: %w", dashboardFile, err)
		}
		exprs = append(exprs, dashboardExprs(dash)...)
	}
	if len(exprs) == 0 {
		return nil, fmt.Errorf("no expressions in %q and %q", rulesFile, dashboardFile)
	}
	seen := map[string]bool{}
	for _, e := range exprs {
		expr, err := p.ParseExpr(e)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", e, err)
		}
		found := false
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok {
				for _, m := range vs.LabelMatchers {
					if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
						seen[m.Value] = true
						found = true
					}
				}
			}
			return nil
		})
		if !found {
			return nil, fmt.Errorf("%q selects no metric by name", e)
		}
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// dashboardExprs returns every "expr" of every target of a dashboard's
// panels, rows' panels included.
func dashboardExprs(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		if e, ok := v["expr"].(string); ok {
			out = append(out, e)
		}
		for _, child := range v {
			out = append(out, dashboardExprs(child)...)
		}
	case []any:
		for _, child := range v {
			out = append(out, dashboardExprs(child)...)
		}
	}
	return out
}
