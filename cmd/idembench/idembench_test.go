package main

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentileIsNearestRank(t *testing.T) {
	t.Parallel()
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 50*time.Millisecond, percentile(lat, 0.50))
	require.Equal(t, 99*time.Millisecond, percentile(lat, 0.99))
	require.Equal(t, 100*time.Millisecond, percentile(lat, 1))
	require.Equal(t, 7*time.Millisecond, percentile([]time.Duration{7 * time.Millisecond}, 0.99))
	require.Zero(t, percentile(nil, 0.5))
}

func TestStatsMergeCombinesRounds(t *testing.T) {
	t.Parallel()
	a := newStats([]time.Duration{3, 1, 2}, time.Second)
	b := newStats([]time.Duration{10, 20}, time.Second)
	a.merge(b)
	require.Equal(t, 5, a.Ops)
	require.Equal(t, 2*time.Second, a.Elapsed)
	require.InDelta(t, 2.5, a.Throughput(), 1e-9)
	require.Equal(t, time.Duration(3), a.P50)
	require.Equal(t, time.Duration(20), a.P99)
	require.Zero(t, (*stats)(nil).Throughput())
}

func TestClosedLoopCountsOnlyAfterWarmupAndStopsOnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := closedLoop(ctx, 2, 20*time.Millisecond, 30*time.Millisecond, func(context.Context, int, int) error { return nil })
	require.NoError(t, err)
	require.Positive(t, s.Ops)
	require.GreaterOrEqual(t, s.Elapsed, 30*time.Millisecond)

	_, err = closedLoop(ctx, 2, 0, time.Minute, func(_ context.Context, w, i int) error {
		if i == 3 {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

func TestNiceScale(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		max, step, top float64
	}{
		{4000, 1000, 4000},
		{3210, 1000, 4000},
		{11.6, 2.5, 12.5},
		{0.37, 0.1, 0.4},
		{0, 1, 5},
	} {
		step, top := niceScale(tc.max, 5)
		require.InDelta(t, tc.step, step, 1e-9, "max %g", tc.max)
		require.InDelta(t, tc.top, top, 1e-9, "max %g", tc.max)
	}
	require.Equal(t, "2.5", formatTick(2.5, 2.5))
	require.Equal(t, "3000", formatTick(3000, 1000))
	require.Equal(t, "0.30", formatTick(0.3, 0.05))
}

func TestDrawTextSetsTheGlyphsPixels(t *testing.T) {
	t.Parallel()
	img := image.NewRGBA(image.Rect(0, 0, 40, 20))
	end := drawText(img, 1, 1, 1, "1", color.Black)
	require.Equal(t, 1+glyphW+1, end)
	want := 0
	for _, col := range glyphs['1'-firstGlyph] {
		for row := range glyphH {
			if col&(1<<row) != 0 {
				want++
			}
		}
	}
	got := 0
	for y := range 20 {
		for x := range 40 {
			if _, _, _, a := img.At(x, y).RGBA(); a != 0 {
				got++
			}
		}
	}
	require.Equal(t, want, got)
	require.Equal(t, 2*(glyphW+1)*2-2, textWidth("ab", 2))
}

func TestWritePlotWritesALabelledPNG(t *testing.T) {
	t.Parallel()
	var points []*loadPoint
	for i, c := range []int{1, 4, 16, 64} {
		f := time.Duration(i + 1)
		mk := func(ops int) *stats {
			return &stats{Ops: ops * (i + 1), Elapsed: time.Second, P50: f * time.Millisecond, P99: 3 * f * time.Millisecond}
		}
		points = append(points, &loadPoint{Concurrency: c, Runner: mk(500), Baseline: mk(600), Plain: mk(400), Commit: mk(3000)})
	}
	path := filepath.Join(t.TempDir(), "docs", "performance.png")
	require.NoError(t, writePlot(path, points))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(raw))
	require.NoError(t, err)
	require.Equal(t, image.Rect(0, 0, 1400, 680), img.Bounds())
	seen := map[color.RGBA]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), uint8(a >> 8)}] = true
		}
	}
	for _, c := range []color.RGBA{colRunner, colBaseline, colPlain, colCommit, colText} {
		require.True(t, seen[c], "colour %v is drawn", c)
	}

	require.Error(t, writePlot(path, nil))
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []int{1, 4, 16, 64}, o.Concurrency)
	require.Equal(t, 3*time.Second, o.Duration)
	require.Equal(t, 10_000_000, o.Scale.Large)
	require.Equal(t, 104, o.MaxConns, "room for the storm")
	require.Len(t, o.Sections, len(allSections))

	o, err = parseFlags([]string{"-quick", "-duration", "1s", "-concurrency", "16, 4,4", "-sections", "load"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, time.Second, o.Duration, "an explicit flag beats -quick")
	require.Equal(t, 100_000, o.Scale.Large)
	require.Equal(t, []int{4, 16}, o.Concurrency)
	require.Equal(t, map[string]bool{"load": true}, o.Sections)

	for _, args := range [][]string{
		{"-concurrency", "0"},
		{"-concurrency", "x"},
		{"-sections", "nope"},
		{"-workloads", "nope"},
		{"-scale-large", "10"},
		{"-rounds", "0"},
		{"stray"},
	} {
		_, err := parseFlags(args, io.Discard)
		require.Error(t, err, "%v", args)
	}
}

// TestQuickRun runs every section, small, against a real Postgres (a
// throwaway cluster, or DATABASE_URL), and checks what does not depend on
// timing: the report's sections, the round-trip and storm verdicts, the plot.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Postgres and runs the whole benchmark, small")
	}
	t.Parallel()
	dir := t.TempDir()
	o, err := parseFlags([]string{"-quick", "-concurrency", "1,4", "-duration", "100ms", "-storm-size", "20", "-storm-rounds", "2",
		"-scale-small", "500", "-scale-large", "5000", "-scale-expired", "1000", "-replay-keys", "20",
		"-plot", filepath.Join(dir, "perf.png"), "-out", filepath.Join(dir, "perf.md")}, io.Discard)
	require.NoError(t, err)
	o.ReferenceAt = 4
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(ctx, o, &stdout, &stderr), stderr.String())

	report := stdout.String()
	for _, section := range []string{"## 1. Framework overhead", "## 2. Round trips per request", "## 3. Replay path",
		"## 4. Duplicate storm", "## 5. Commit ceiling", "## 6. Scale", "## Targets"} {
		require.Contains(t, report, section)
	}
	require.Contains(t, report, "| acquisition is one round trip (new key, replay, in progress) | new key 1, replay 1, in progress 1 | met |")
	require.Contains(t, report, "| at most one round trip per phase beyond its own statements | at most 1 | met |")
	require.Contains(t, report, "| duplicate storm: exactly one execution every round | 2 of 2 rounds;")
	require.Contains(t, report, "| runner | new key | 7 | 7 |", "one round trip to acquire, two per phase")
	require.Contains(t, report, "reaper deleted 1000 keys")
	require.Equal(t, 2, strings.Count(report, "| runner/baseline throughput")+strings.Count(report, "| replays >="))

	written, err := os.ReadFile(filepath.Join(dir, "perf.md"))
	require.NoError(t, err)
	require.Equal(t, report, string(written))
	f, err := os.Open(filepath.Join(dir, "perf.png"))
	require.NoError(t, err)
	defer f.Close()
	_, err = png.Decode(f)
	require.NoError(t, err)
}
