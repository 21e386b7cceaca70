package report

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

var modeColors = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // orange
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, // purple
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, // brown
}

// PlotTTFTCDF writes a PNG (by path's extension: png, svg, pdf) of each mode's TTFT CDF.
// The x axis is logarithmic when every TTFT is positive.
func PlotTTFTCDF(path, title string, modes []Mode) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "TTFT (ms)"
	p.Y.Label.Text = "fraction of requests"
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	logX := true
	seen := false
	for _, m := range modes {
		for _, v := range m.TTFTMs {
			seen = true
			if v <= 0 {
				logX = false
			}
		}
	}
	if logX && seen {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	for i, m := range modes {
		n := len(m.TTFTMs)
		if n == 0 {
			continue
		}
		xys := make(plotter.XYs, 0, 2*n)
		for j, v := range m.TTFTMs { // sorted: a step function
			xys = append(xys, plotter.XY{X: v, Y: float64(j) / float64(n)}, plotter.XY{X: v, Y: float64(j+1) / float64(n)})
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", m.Mode, err)
		}
		l.Color = modeColors[i%len(modeColors)]
		l.Width = vg.Points(1.5)
		l.Dashes = dashes(i / len(modeColors))
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (p95 %s ms)", m.Mode, fms(m.TTFT.P95)), l)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

func dashes(k int) []vg.Length {
	if k == 0 {
		return nil
	}
	return []vg.Length{vg.Points(float64(2 + 2*k)), vg.Points(2)}
}
