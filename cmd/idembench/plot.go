package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The plot is two panels side by side, throughput and latency against
// client concurrency, of 700 by 360 points at 144 dots per inch: a PNG of
// 1400 by 720 pixels.
const (
	plotWidth  = 700 * vg.Inch / 72
	plotHeight = 360 * vg.Inch / 72
	plotDPI    = 144
)

var (
	// flowColors colour the flows, in workloadsOf(kindFlow)'s order, alike
	// in both panels: the runners blue, orange and cyan, the baseline red,
	// the single-transaction contender purple, the plain transaction brown.
	flowColors = []color.Color{
		color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x17, 0xbe, 0xcf, 0xff},
		color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
	}
	// commitCeilingColor draws the commit ceiling, a reference rather
	// than a flow.
	commitCeilingColor = color.RGBA{0x7f, 0x7f, 0x7f, 0xff}
)

// flowColor is the colour of the i-th flow.
func flowColor(i int) color.Color { return flowColors[i%len(flowColors)] }

// linearTicks labels about five steps of 1, 2, 2.5 or 5 times a power of
// ten from lo to hi.
func linearTicks(lo, hi float64) []plot.Tick {
	raw := (hi - lo) / 5
	if raw <= 0 || math.IsInf(raw, 0) || math.IsNaN(raw) {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'f', -1, 64)}}
	}
	mag := math.Pow10(int(math.Floor(math.Log10(raw))))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ticks
}

// logTicks labels 1, 2 and 5 times each power of ten within the axis'
// range (plot.LogTicks labels only the powers, and one beyond the range,
// which plot.Align then makes room for).
func logTicks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for d := math.Pow10(int(math.Floor(math.Log10(lo)))); d <= hi; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := d * m; v >= lo && v <= hi {
				ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ticks
}

// writePlot draws throughput and latency against client concurrency for
// the runner and the baselines, and writes it as a PNG.
func writePlot(path string, points []*loadPoint) error {
	if len(points) == 0 {
		return errors.New("nothing to plot")
	}
	conc := make([]float64, len(points))
	var ticks []plot.Tick
	for i, p := range points {
		conc[i] = float64(p.Concurrency)
		ticks = append(ticks, plot.Tick{Value: conc[i], Label: strconv.Itoa(p.Concurrency)})
	}
	series := func(f func(*loadPoint) float64) plotter.XYs {
		xys := make(plotter.XYs, len(points))
		for i, p := range points {
			xys[i] = plotter.XY{X: conc[i], Y: f(p)}
		}
		return xys
	}
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	panel := func(title, ylabel string) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "client concurrency"
		p.Y.Label.Text = ylabel
		// Concurrencies are powers of four: a log scale spaces them evenly.
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.TextStyle.Font.Size = vg.Points(9)
		p.Legend.Padding = vg.Points(2)
		p.Legend.XOffs, p.Legend.YOffs = vg.Points(6), -vg.Points(4)
		p.Add(plotter.NewGrid())
		return p
	}
	addLine := func(p *plot.Plot, name string, xys plotter.XYs, c color.Color, dashed bool) error {
		line, dots, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		line.Color, line.Width = c, vg.Points(1.5)
		if dashed {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		dots.Color, dots.Shape = c, draw.CircleGlyph{}
		p.Add(line, dots)
		if name != "" {
			p.Legend.Add(name, line, dots)
		}
		return nil
	}

	through := panel("Throughput (higher is better)", "requests per second")
	// The latency axis has no label: gonum centres one on the mean of the
	// range's ends, high up on a log scale, and shrinks the panel for it.
	latency := panel("Latency in ms, p50 solid, p99 dashed (lower is better)", "")
	latency.Y.Scale = plot.LogScale{}
	latency.Y.Tick.Marker = plot.TickerFunc(logTicks)
	through.Y.Tick.Marker = plot.TickerFunc(linearTicks)
	top, fastest, slowest := 0.0, math.Inf(1), 0.0
	for i, w := range workloadsOf(kindFlow) {
		name, c := w.name, flowColor(i)
		if points[0].workload(name) == nil {
			continue // not run (-workloads)
		}
		tp := series(func(p *loadPoint) float64 { return p.workload(name).Throughput() })
		for _, xy := range tp {
			top = max(top, xy.Y)
		}
		if err := addLine(through, w.label, tp, c, false); err != nil {
			return err
		}
		if name == "plain" {
			continue // the baseline's code, shown by its throughput
		}
		// A point that measured no request (a window shorter than one) has
		// no latency, and a log scale no zero.
		measured := func(xys plotter.XYs) plotter.XYs {
			return slices.DeleteFunc(xys, func(xy plotter.XY) bool { return xy.Y <= 0 })
		}
		p50 := measured(series(func(p *loadPoint) float64 { return ms64(p.workload(name).P50) }))
		p99 := measured(series(func(p *loadPoint) float64 { return ms64(p.workload(name).P99) }))
		if len(p50) == 0 || len(p99) == 0 {
			continue
		}
		for _, xy := range p50 {
			fastest = min(fastest, xy.Y)
		}
		for _, xy := range p99 {
			slowest = max(slowest, xy.Y)
		}
		if err := errors.Join(addLine(latency, w.label, p50, c, false), addLine(latency, "", p99, c, true)); err != nil {
			return err
		}
	}
	// The database's own commit rate, divided by the runner's commits per
	// request: what the runner would reach if commits were all it cost.
	if points[0].workload("commit") != nil {
		runner := workloadNamed("runner")
		ceiling := series(func(p *loadPoint) float64 { return p.workload("commit").Throughput() / float64(runner.commits) })
		for _, xy := range ceiling {
			top = max(top, xy.Y)
		}
		if err := addLine(through, fmt.Sprintf("INSERT+commit / %d", runner.commits), ceiling, commitCeilingColor, true); err != nil {
			return err
		}
	}
	// Room above the lines for the legends.
	through.Y.Min, through.Y.Max = 0, 1.5*top
	if fastest <= slowest {
		latency.Y.Min, latency.Y.Max = math.Pow10(int(math.Floor(math.Log10(fastest)))), 4*slowest
	}

	img := vgimg.NewWith(vgimg.UseWH(plotWidth, plotHeight), vgimg.UseDPI(plotDPI))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(24), PadTop: vg.Points(24), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12)}
	through.Draw(tiles.At(dc, 0, 0))
	latency.Draw(tiles.At(dc, 1, 0))
	dc.FillText(draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 13), XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler},
		vg.Point{X: plotWidth / 2, Y: plotHeight - vg.Points(6)}, "idem: three-phase flow, a new key per request, against client concurrency")

	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return errors.Join(err, f.Close())
}

// ms64 is d in milliseconds.
func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
