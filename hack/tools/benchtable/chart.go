package main

import (
	"fmt"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// chart draws ours ÷ upstream, the medians' ratio, for every scenario and
// metric both have, as horizontal bars on a log scale from 1×: a bar to the
// left means ours is lower. Ratios beyond 1/16× and 16× are drawn at those
// bounds, with the label saying so, so that one outlier does not squash
// the rest.
func (t *table) chart(path, title string) error {
	var labels []string
	var ratios plotter.Values
	for _, s := range t.scenarios {
		for _, m := range t.metrics[s] {
			ours, up := t.values[key{s, m, "ours"}], t.values[key{s, m, "upstream"}]
			if len(ours) == 0 || len(up) == 0 || median(up) <= 0 || median(ours) <= 0 {
				continue
			}
			label := strings.TrimPrefix(s, "Benchmark") + "  " + m
			r := math.Log2(median(ours) / median(up))
			if math.Abs(r) > maxLog2Ratio {
				label += fmt.Sprintf(" (%.3g×, clipped)", math.Exp2(r))
				r = math.Copysign(maxLog2Ratio, r)
			}
			labels = append(labels, label)
			ratios = append(ratios, r)
		}
	}
	if len(ratios) == 0 {
		return fmt.Errorf("no metric has both ours and upstream")
	}
	// NominalY puts the first label at the bottom; read top-down instead.
	for i, j := 0, len(ratios)-1; i < j; i, j = i+1, j-1 {
		labels[i], labels[j] = labels[j], labels[i]
		ratios[i], ratios[j] = ratios[j], ratios[i]
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "ours ÷ upstream (left of 1×: ours is lower)"
	p.X.Tick.Marker = ratioTicks{}
	bars, err := plotter.NewBarChart(ratios, vg.Points(9))
	if err != nil {
		return err
	}
	bars.Horizontal = true
	p.Add(plotter.NewGrid(), bars)
	p.NominalY(labels...)
	return p.Save(10*vg.Inch, vg.Points(float64(14*len(labels)+80)), path)
}

// maxLog2Ratio is where bars are clipped: 16×.
const maxLog2Ratio = 4

// ratioTicks labels log2 ratios as the ratios they stand for.
type ratioTicks struct{}

func (ratioTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for k := math.Floor(min); k <= math.Ceil(max); k++ {
		ticks = append(ticks, plot.Tick{Value: k, Label: fmt.Sprintf("%g×", math.Exp2(k))})
	}
	return ticks
}
