package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestMetricNames runs the checker on rule files and dashboards that
// parse and that do not: a broken expression, an expression that names no
// metric, and a rule the rule loader rejects all fail.
func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		name, rules, dashboard string
		want                   []string
		wantErr                string
	}{
		{name: "rules and dashboard",
			rules: "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(rate(a_total[5m])) > 0\n",
			dashboard: `{"panels": [{"targets": [{"expr": "histogram_quantile(0.99, sum by (le) (rate(b_seconds_bucket{x=\"y\"}[5m])))"}]},
				{"panels": [{"targets": [{"expr": "c / on() group_left d"}]}]}]}`,
			want: []string{"a_total", "b_seconds_bucket", "c", "d"}},
		{name: "broken expression", rules: "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(rate(a_total[5m]) > 0\n", wantErr: "unclosed"},
		{name: "no metric named", dashboard: `{"panels": [{"targets": [{"expr": "vector(1)"}]}]}`, wantErr: "selects no metric"},
		{name: "an alert with no name", rules: "groups:\n- name: g\n  rules:\n  - expr: up\n", wantErr: "record"},
		{name: "nothing", dashboard: `{"panels": []}`, wantErr: "no expressions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var rules, dashboard string
			if tc.rules != "" {
				rules = filepath.Join(dir, "rules.yaml")
				write(t, rules, tc.rules)
			}
			if tc.dashboard != "" {
				dashboard = filepath.Join(dir, "dashboard.json")
				write(t, dashboard, tc.dashboard)
			}
			got, err := metricNames(rules, dashboard)
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one with %q", err, tc.wantErr)
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case !slices.Equal(got, tc.want):
				t.Fatalf("names %v, want %v", got, tc.want)
			}
		})
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
