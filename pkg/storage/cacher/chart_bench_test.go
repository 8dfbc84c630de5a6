package cacher

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chartPath, when set, makes the fan-out benchmarks draw CPU per delivered
// event and p99 latency against watcher count, ours beside upstream's.
var chartPath = flag.String("chart", "", "write a PNG chart of the fan-out benchmarks to this path")

// chartPoint is one fan-out run's result for the chart.
type chartPoint struct {
	watchers      int
	cpuPerEventUs float64
	p99Ms         float64
}

var (
	// chartMu guards chartData.
	chartMu   sync.Mutex
	chartData = map[string][]chartPoint{}
)

func recordChart(impl string, watchers int, r fanOutResult) {
	if *chartPath == "" || r.delivered == 0 {
		return
	}
	p := chartPoint{watchers: watchers, cpuPerEventUs: float64(r.cpu.Microseconds()) / float64(r.delivered)}
	if n := len(r.latencies); n > 0 {
		p.p99Ms = float64(r.latencies[int(0.99*float64(n-1))].Microseconds()) / 1000
	}
	chartMu.Lock()
	defer chartMu.Unlock()
	chartData[impl] = append(chartData[impl], p)
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(benchEtcdEnv); dir != "" {
		os.Exit(runBenchEtcd(dir))
	}
	code := m.Run()
	if *chartPath != "" {
		if err := writeChart(*chartPath); err != nil {
			fmt.Fprintln(os.Stderr, "chart:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// medians reduces repeated runs to one point per watcher count, the
// median of each value, sorted by watcher count.
func medians(points []chartPoint) []chartPoint {
	byWatchers := map[int][]chartPoint{}
	for _, p := range points {
		byWatchers[p.watchers] = append(byWatchers[p.watchers], p)
	}
	var out []chartPoint
	for w, ps := range byWatchers {
		median := func(value func(chartPoint) float64) float64 {
			v := make([]float64, len(ps))
			for i, p := range ps {
				v[i] = value(p)
			}
			sort.Float64s(v)
			return v[len(v)/2]
		}
		out = append(out, chartPoint{watchers: w,
			cpuPerEventUs: median(func(p chartPoint) float64 { return p.cpuPerEventUs }),
			p99Ms:         median(func(p chartPoint) float64 { return p.p99Ms })})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].watchers < out[j].watchers })
	return out
}

// writeChart draws two panels: CPU per delivered event, and p99 latency,
// each against watcher count, one line per implementation.
func writeChart(path string) error {
	chartMu.Lock()
	defer chartMu.Unlock()
	if len(chartData) == 0 {
		// make bench always asks for the chart, whatever BENCH_FILTER runs.
		fmt.Fprintln(os.Stderr, "chart: no BenchmarkFanOutFixedRate results, nothing drawn")
		return nil
	}
	cpu, p99 := plot.New(), plot.New()
	cpu.Title.Text, cpu.X.Label.Text, cpu.Y.Label.Text = "CPU per delivered event", "watchers", "µs"
	p99.Title.Text, p99.X.Label.Text, p99.Y.Label.Text = "p99 latency, write to watcher", "watchers", "ms"
	impls := make([]string, 0, len(chartData))
	for impl := range chartData {
		impls = append(impls, impl)
	}
	sort.Strings(impls)
	var cpuLines, p99Lines []interface{}
	for _, impl := range impls {
		points := medians(chartData[impl])
		c, l := make(plotter.XYs, len(points)), make(plotter.XYs, len(points))
		for i, p := range points {
			c[i] = plotter.XY{X: float64(p.watchers), Y: p.cpuPerEventUs}
			l[i] = plotter.XY{X: float64(p.watchers), Y: p.p99Ms}
		}
		cpuLines = append(cpuLines, impl, c)
		p99Lines = append(p99Lines, impl, l)
	}
	for _, p := range []*plot.Plot{cpu, p99} {
		p.Y.Min = 0
		p.Legend.Top = true
		p.Legend.Left = true
	}
	if err := plotutil.AddLinePoints(cpu, cpuLines...); err != nil {
		return err
	}
	if err := plotutil.AddLinePoints(p99, p99Lines...); err != nil {
		return err
	}
	img := vgimg.New(12*vg.Inch, 4.5*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 4}
	cpu.Draw(tiles.At(dc, 0, 0))
	p99.Draw(tiles.At(dc, 1, 0))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return err
}
