package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// series is one line of a panel.
type series struct {
	Name   string
	Color  color.RGBA
	Dashed bool
	Values []float64 // one per concurrency
}

// panel is one chart: a y axis, and lines over the concurrencies.
type panel struct {
	Title  string
	YLabel string
	// LogY draws the y axis on a log scale, for latencies that span
	// orders of magnitude across concurrencies.
	LogY   bool
	Series []series
}

var (
	colRunner   = color.RGBA{0x1f, 0x77, 0xb4, 0xff}
	colBaseline = color.RGBA{0xd6, 0x27, 0x28, 0xff}
	colPlain    = color.RGBA{0x7f, 0x7f, 0x7f, 0xff}
	colCommit   = color.RGBA{0x2c, 0xa0, 0x2c, 0xff}
	colSingle   = color.RGBA{0x94, 0x67, 0xbd, 0xff}
	colAxis     = color.RGBA{0x33, 0x33, 0x33, 0xff}
	colGrid     = color.RGBA{0xe3, 0xe3, 0xe3, 0xff}
	colText     = color.RGBA{0x11, 0x11, 0x11, 0xff}
	// plotPalette colours the flows that have no colour of their own.
	plotPalette = []color.RGBA{{0xff, 0x7f, 0x0e, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x17, 0xbe, 0xcf, 0xff}}
)

// writePlot draws throughput and latency against client concurrency for
// the runner and the baselines, and writes it as a PNG.
func writePlot(path string, points []*loadPoint) error {
	img, err := renderPlot(points)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return err
	}
	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func renderPlot(points []*loadPoint) (*image.RGBA, error) {
	if len(points) == 0 {
		return nil, fmt.Errorf("nothing to plot")
	}
	conc := make([]int, len(points))
	pick := func(f func(*loadPoint) float64) []float64 {
		v := make([]float64, len(points))
		for i, p := range points {
			v[i] = f(p)
		}
		return v
	}
	for i, p := range points {
		conc[i] = p.Concurrency
	}
	msOf := func(s *stats, p99 bool) float64 {
		if p99 {
			return s.P99.Seconds() * 1000
		}
		return s.P50.Seconds() * 1000
	}
	// Every flow's throughput, against the commit ceiling divided by the
	// runner's commits per request; the latency of the flows but the
	// plain transaction (the baseline's code, shown by throughput).
	runner := workloadNamed("runner")
	through := panel{Title: "Throughput (higher is better)", YLabel: "requests per second"}
	latency := panel{Title: "Latency (lower is better)", YLabel: "milliseconds (log scale)", LogY: true}
	extra := 0
	for _, w := range workloadsOf(kindFlow) {
		col := w.color
		if col == (color.RGBA{}) {
			col = plotPalette[extra%len(plotPalette)]
			extra++
		}
		name := w.name
		through.Series = append(through.Series, series{Name: w.label, Color: col,
			Values: pick(func(p *loadPoint) float64 { return p.workload(name).Throughput() })})
		if name == "plain" {
			continue
		}
		latency.Series = append(latency.Series,
			series{Name: w.label + " p50", Color: col, Values: pick(func(p *loadPoint) float64 { return msOf(p.workload(name), false) })},
			series{Name: w.label + " p99", Color: col, Dashed: true, Values: pick(func(p *loadPoint) float64 { return msOf(p.workload(name), true) })})
	}
	through.Series = append(through.Series, series{Name: fmt.Sprintf("INSERT+commit / %d", runner.commits), Color: colCommit, Dashed: true,
		Values: pick(func(p *loadPoint) float64 { return p.workload("commit").Throughput() / float64(runner.commits) })})
	panels := []panel{through, latency}
	legendRows := 0
	for _, pn := range panels {
		legendRows = max(legendRows, (len(pn.Series)+1)/2)
	}

	const (
		width  = 1400
		scale  = 2
		panelW = 560
		panelH = 430
		top    = 90
	)
	// Room below the panels for the axis label and the legend's rows.
	height := max(680, top+panelH+70+legendRows*26+24)
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fillRect(img, 0, 0, width, height, color.White)
	title := "idem: three-phase flow, a new key per request, against client concurrency"
	drawText(img, (width-textWidth(title, 3))/2, 20, 3, title, colText)
	for i, pn := range panels {
		drawPanel(img, 110+i*700, top, panelW, panelH, scale, conc, pn)
	}
	return img, nil
}

func drawPanel(img *image.RGBA, left, top, w, h, scale int, conc []int, pn panel) {
	drawText(img, left+(w-textWidth(pn.Title, scale))/2, top-30, scale, pn.Title, colText)

	ymin, ymax := math.Inf(1), 0.0
	for _, s := range pn.Series {
		for _, v := range s.Values {
			ymax = math.Max(ymax, v)
			if v > 0 {
				ymin = math.Min(ymin, v)
			}
		}
	}
	var ticks []float64
	var yOf func(v float64) int
	label := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	if pn.LogY && ymax > 0 && !math.IsInf(ymin, 1) {
		lo := math.Pow(10, math.Floor(math.Log10(ymin)))
		hi := math.Pow(10, math.Ceil(math.Log10(ymax)))
		if hi <= lo {
			hi = lo * 10
		}
		for d := lo; d <= hi*1.0001; d *= 10 {
			for _, m := range []float64{1, 2, 5} {
				if v := d * m; v <= hi*1.0001 {
					ticks = append(ticks, v)
				}
			}
		}
		yOf = func(v float64) int {
			v = math.Max(v, lo)
			frac := (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
			return top + h - int(math.Round(frac*float64(h)))
		}
	} else {
		step, top2 := niceScale(ymax, 5)
		for i := 0; float64(i)*step <= top2+step/2; i++ {
			ticks = append(ticks, float64(i)*step)
		}
		label = func(v float64) string { return formatTick(v, step) }
		yOf = func(v float64) int { return top + h - int(math.Round(v/top2*float64(h))) }
	}
	// Grid and y ticks.
	for _, v := range ticks {
		y := yOf(v)
		drawLine(img, left, y, left+w, y, 1, colGrid, false)
		text := label(v)
		drawText(img, left-12-textWidth(text, scale), y-glyphH*scale/2, scale, text, colText)
	}
	drawTextUp(img, left-100, top+(h+textWidth(pn.YLabel, scale))/2, scale, pn.YLabel, colText)

	// x positions: concurrency on a log scale, so 1, 4, 16, 64 are evenly
	// spaced.
	xs := make([]int, len(conc))
	lo, hi := math.Log(float64(conc[0])), math.Log(float64(conc[len(conc)-1]))
	for i, c := range conc {
		frac := 0.5
		if hi > lo {
			frac = (math.Log(float64(c)) - lo) / (hi - lo)
		}
		xs[i] = left + 30 + int(math.Round(frac*float64(w-60)))
		drawLine(img, xs[i], top+h, xs[i], top+h+6, 2, colAxis, false)
		label := strconv.Itoa(c)
		drawText(img, xs[i]-textWidth(label, scale)/2, top+h+12, scale, label, colText)
	}
	xl := "client concurrency"
	drawText(img, left+(w-textWidth(xl, scale))/2, top+h+38, scale, xl, colText)

	// Axes.
	drawLine(img, left, top, left, top+h, 2, colAxis, false)
	drawLine(img, left, top+h, left+w, top+h, 2, colAxis, false)

	// Lines and markers.
	for _, s := range pn.Series {
		prevX, prevY := -1, -1
		for i, v := range s.Values {
			x := xs[i]
			y := yOf(v)
			if prevX >= 0 {
				drawLine(img, prevX, prevY, x, y, 3, s.Color, s.Dashed)
			}
			fillRect(img, x-4, y-4, 9, 9, s.Color)
			prevX, prevY = x, y
		}
	}

	// Legend, below the axis label, two entries a row.
	ly := top + h + 70
	for i, s := range pn.Series {
		x := left + (i%2)*(w/2+30)
		y := ly + (i/2)*26
		drawLine(img, x, y+glyphH*scale/2, x+40, y+glyphH*scale/2, 3, s.Color, s.Dashed)
		drawText(img, x+50, y, scale, s.Name, colText)
	}
}

// niceScale returns a tick step of 1, 2 or 5 times a power of ten and the
// axis top (a multiple of it) for data up to max, with about n ticks.
func niceScale(max float64, n int) (step, top float64) {
	if max <= 0 || math.IsNaN(max) || math.IsInf(max, 0) {
		return 1, float64(n)
	}
	raw := max / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	return step, math.Ceil(max/step) * step
}

// formatTick prints v with as many decimals as the step needs.
func formatTick(v, step float64) string {
	decimals := 0
	for decimals < 6 {
		scaled := step * math.Pow(10, float64(decimals))
		if math.Abs(scaled-math.Round(scaled)) < 1e-9 {
			break
		}
		decimals++
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// drawLine draws a line of the given thickness from (x0, y0) to (x1, y1),
// dashed if asked (10 pixels on, 7 off).
func drawLine(img *image.RGBA, x0, y0, x1, y1, thick int, c color.Color, dashed bool) {
	dx, dy := float64(x1-x0), float64(y1-y0)
	length := math.Hypot(dx, dy)
	steps := int(math.Ceil(length))
	if steps == 0 {
		fillRect(img, x0-thick/2, y0-thick/2, thick, thick, c)
		return
	}
	for i := 0; i <= steps; i++ {
		if dashed && i%17 >= 10 {
			continue
		}
		t := float64(i) / float64(steps)
		x := int(math.Round(float64(x0) + t*dx))
		y := int(math.Round(float64(y0) + t*dy))
		fillRect(img, x-thick/2, y-thick/2, thick, thick, c)
	}
}
