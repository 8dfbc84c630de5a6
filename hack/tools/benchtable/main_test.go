package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	in := `goos: linux
BenchmarkFanOut/watchers=1000/ours-2      1  161415737 ns/op  100.0 %delivered  0 closed  0.5 cpu-us/event
BenchmarkFanOut/watchers=1000/upstream-2  1   94591775 ns/op   11.2 %delivered  986 closed  2.0 cpu-us/event
BenchmarkFanOut/watchers=1000/ours-2      1  161415737 ns/op  100.0 %delivered  0 closed  0.7 cpu-us/event
BenchmarkFanOut/watchers=1000/upstream-2  1   94591775 ns/op   13.0 %delivered  900 closed  3.0 cpu-us/event
BenchmarkFanOut/watchers=1000/ours-2      1  161415737 ns/op  100.0 %delivered  0 closed  0.6 cpu-us/event
BenchmarkFanOut/watchers=1000/upstream-2  1   94591775 ns/op   12.0 %delivered  950 closed  4.0 cpu-us/event
BenchmarkFanOut/watchers=1000/etcd3-2     1   94591775 ns/op  100.0 %delivered  0 closed  10 cpu-us/event
BenchmarkHTTPWatch/streams=1000/impl=ours-2      1  1 ns/op  22000 events/s
BenchmarkHTTPWatch/streams=1000/impl=upstream-2  1  1 ns/op  20000 events/s
BenchmarkWatchListWrites/impl=ours-2         1  1 ns/op  4 writes-p99-ms
BenchmarkWatchListWrites/impl=upstream-2     1  1 ns/op  100 writes-p99-ms
BenchmarkWatchListWrites/impl=ours#01-2      1  1 ns/op  6 writes-p99-ms
BenchmarkWatchListWrites/impl=upstream#01-2  1  1 ns/op  300 writes-p99-ms
BenchmarkUpstreamStore/impl=ours/List/RV=Exact/Scope=Cluster-2      200  1 ns/op  4000 list-objs/s
BenchmarkUpstreamStore/impl=upstream/List/RV=Exact/Scope=Cluster-2  200  1 ns/op  2000 list-objs/s
BenchmarkOther  1  5 ns/op
ok  	pkg	1s
`
	var passthrough, out bytes.Buffer
	tab, err := parse(strings.NewReader(in), &passthrough)
	if err != nil {
		t.Fatal(err)
	}
	tab.write(&out)
	for _, want := range []string{
		"| FanOut/watchers=1000 | cpu-us/event | 0.60 (0.50–0.70) | 3.00 (2.00–4.00) | 0.20× | 3 |",
		"| FanOut/watchers=1000 | closed | 0.00 (0.00–0.00) | 950 (900–986) | 0.00× | 3 |",
		"| HTTPWatch/streams=1000 | events/s | 22.0 k | 20.0 k | 1.10× | 1 |",
		"| UpstreamStore/List/RV=Exact/Scope=Cluster | list-objs/s | 4000 | 2000 | 2.00× | 1 |",
		"| WatchListWrites | writes-p99-ms | 5.00 (4.00–6.00) | 200 (100–300) | 0.03× | 2 |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks\n%s\nin\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "ns/op") {
		t.Errorf("the table reports ns/op:\n%s", out.String())
	}
	for _, want := range []string{"goos: linux", "BenchmarkOther", "ok  \tpkg"} {
		if !strings.Contains(passthrough.String(), want) {
			t.Errorf("%q did not pass through: %s", want, passthrough.String())
		}
	}
}

func TestChart(t *testing.T) {
	in := `BenchmarkScale/objects=10/payload=1/impl=ours-2      1  1 ns/op  100 heap-B/object  4 list-ms
BenchmarkScale/objects=10/payload=1/impl=upstream-2  1  1 ns/op  200 heap-B/object  2 list-ms
BenchmarkScale/objects=10/payload=1/impl=ours-2      1  1 ns/op  0 only-ours
`
	tab, err := parse(strings.NewReader(in), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "chart.png")
	if err := tab.chart(path, "test"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || !bytes.HasPrefix(data, []byte("\x89PNG")) {
		t.Fatalf("no PNG written: %v", err)
	}
	if err := (&table{metrics: map[string][]string{}, values: map[key][]float64{}}).chart(path, ""); err == nil {
		t.Errorf("an empty table drew a chart")
	}
	var got []string
	for _, tick := range (ratioTicks{}).Ticks(-1.2, 1) {
		got = append(got, tick.Label)
	}
	if strings.Join(got, " ") != "0.25× 0.5× 1× 2×" {
		t.Errorf("ticks %q", got)
	}
}
