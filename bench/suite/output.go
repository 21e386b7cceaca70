package suite

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// WriteJSON writes the whole result (every arm's report.Mode, flags and notes) to path,
// indented. Run it after Analyze so the flags are set.
func WriteJSON(path string, r *Result) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Plot sizes: a group of bars per cell, one bar per policy.
const (
	plotGroupWidth = 0.8 // of one x unit, shared by a group's bars
	plotHeight     = 5 * vg.Inch
	plotMinWidth   = 8 * vg.Inch
	plotPerCell    = 1.4 * vg.Inch
	// plotBarsFraction of the plot's height holds the bars; the legend (one 12-point line per
	// policy, ≈1/3 of a 5-inch plot for 10 policies) fits in the rest, top right.
	plotBarsFraction = 0.6
)

// policyColors are distinct bar colours (matplotlib's tab10), one per policy.
var policyColors = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff},
	color.RGBA{0xe3, 0x77, 0xc2, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff},
	color.RGBA{0x8c, 0x56, 0x4b, 0xff}, color.RGBA{0xbc, 0xbd, 0x22, 0xff}, color.RGBA{0x7f, 0x7f, 0x7f, 0xff},
	color.RGBA{0x17, 0xbe, 0xcf, 0xff},
}

// Plot writes grouped bars of TTFT p95 ÷ the oracle's (y) per cell (group) and policy (bar)
// to path (format by extension: png, svg, pdf). Flagged arms and cells without a valid oracle
// have no bar; a dashed line marks 1 (the oracle).
func Plot(path string, b *Board) error {
	p := plot.New()
	p.Title.Text = "TTFT p95 ÷ oracle's p95 (1 = the oracle; no bar: flagged or no oracle)"
	p.Y.Label.Text = "p95 ÷ oracle"
	p.Y.Min = 0
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	names := make([]string, len(b.Result.Cells))
	for i, c := range b.Result.Cells {
		names[i] = c.Workload + "\n" + c.Level
	}
	pol := b.Result.Policies
	width := max(plotMinWidth, plotPerCell*vg.Length(len(names)))
	// One x unit (a cell) is about (width - the axis' inch) ÷ cells points wide.
	w := (width - vg.Inch) * plotGroupWidth / vg.Length(max(len(names), 1)*max(len(pol), 1))
	top := 1.0
	for j, name := range pol {
		vs := make(plotter.Values, len(names))
		for ci := range b.Result.Cells {
			for _, row := range b.Rows[ci] {
				if row.Policy == name && !math.IsNaN(row.Ratio) {
					vs[ci] = row.Ratio
					top = math.Max(top, row.Ratio)
				}
			}
		}
		bars, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		bars.LineStyle.Width = 0
		bars.Color = policyColors[j%len(policyColors)]
		bars.Offset = w * vg.Length(float64(j)-float64(len(pol)-1)/2)
		p.Add(bars)
		p.Legend.Add(name, bars)
	}
	one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(names)) - 0.5, Y: 1}})
	if err != nil {
		return err
	}
	one.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(one)
	p.Y.Max = top / plotBarsFraction // the legend sits above the bars
	p.NominalX(names...)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return p.Save(width, plotHeight, path)
}
