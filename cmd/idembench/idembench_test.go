package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	// A window long enough for the workers to be scheduled in it on a
	// loaded machine (30 ms once counted nothing under the race detector).
	s, err := closedLoop(ctx, 2, 20*time.Millisecond, time.Second, func(context.Context, int, int) error { return nil })
	require.NoError(t, err)
	require.Positive(t, s.Ops)
	require.GreaterOrEqual(t, s.Elapsed, time.Second)

	_, err = closedLoop(ctx, 2, 0, time.Minute, func(_ context.Context, w, i int) error {
		if i == 3 {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

func TestWritePlotWritesALabelledPNG(t *testing.T) {
	t.Parallel()
	var points []*loadPoint
	for i, c := range []int{1, 4, 16, 64} {
		f := time.Duration(i + 1)
		mk := func(ops int) *stats {
			return &stats{Ops: ops * (i + 1), Elapsed: time.Second, P50: f * time.Millisecond, P99: 3 * f * time.Millisecond}
		}
		points = append(points, &loadPoint{Concurrency: c, Stats: map[string]*stats{
			"runner": mk(500), "runner-joined": mk(550), "runner-onetx": mk(580), "baseline": mk(600), "single": mk(700), "plain": mk(400), "commit": mk(3000)}})
	}
	path := filepath.Join(t.TempDir(), "report", "performance.png")
	require.NoError(t, writePlot(path, points))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(raw))
	require.NoError(t, err)
	require.Equal(t, 1400, img.Bounds().Dx())
	require.Equal(t, 720, img.Bounds().Dy())
	seen := map[color.RGBA]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), uint8(a >> 8)}] = true
		}
	}
	// Every flow's line, and the commit ceiling's, in its own colour.
	for i, w := range workloadsOf(kindFlow) {
		r, g, bl, a := flowColor(i).RGBA()
		require.True(t, seen[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), uint8(a >> 8)}], "%s is drawn", w.label)
	}
	require.True(t, seen[commitCeilingColor], "the commit ceiling is drawn")

	// A point whose window measured no request has no latency to put on
	// the log scale: it is left out, not a panic.
	points[0].Stats["runner"] = &stats{}
	require.NoError(t, writePlot(path, points))

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
	require.Equal(t, "idembench-report", o.ReportDir)
	require.Empty(t, o.Plot, "the plot goes into the report directory, not docs/")

	require.Equal(t, steadyConfig{Window: time.Second, MaxWindows: 30}, o.Scale.Steady)

	o, err = parseFlags([]string{"-quick", "-duration", "1s", "-concurrency", "16, 4,4", "-sections", "load"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, time.Second, o.Duration, "an explicit flag beats -quick")
	require.Equal(t, 100_000, o.Scale.Large)
	require.Equal(t, []int{4, 16}, o.Concurrency)
	require.Equal(t, map[string]bool{"load": true}, o.Sections)

	require.False(t, o.Durable)
	o, err = parseFlags([]string{"-durable"}, io.Discard)
	require.NoError(t, err)
	require.True(t, o.Durable)
	o, err = parseFlags([]string{"-durable", "-synchronous-commit", "on"}, io.Discard)
	require.NoError(t, err)
	require.True(t, o.Durable)
	require.Equal(t, "on", o.SyncCommit)

	for _, args := range [][]string{
		{"-durable", "-synchronous-commit", "off"},
		{"-durable=maybe"},
		{"-concurrency", "0"},
		{"-concurrency", "x"},
		{"-sections", "nope"},
		{"-workloads", "nope"},
		{"-scale-large", "10"},
		{"-rounds", "0"},
		{"-steady-window", "0s"},
		{"-steady-max-windows", "2"},
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
		"-scale-small", "500", "-scale-large", "5000", "-scale-expired", "1000", "-replay-keys", "20", "-steady-window", "50ms",
		"-report-dir", filepath.Join(dir, "report"), "-plot", filepath.Join(dir, "perf.png"), "-out", filepath.Join(dir, "perf.md")}, io.Discard)
	require.NoError(t, err)
	o.ReferenceAt = 4
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(ctx, o, &stdout, &stderr), stderr.String())

	report := stdout.String()
	require.True(t, strings.HasPrefix(report, "# idembench: "), "the heading says how the server commits")
	for _, section := range []string{"## 1. Framework overhead", "## 2. Round trips per request", "## 3. Replay path",
		"## 4. Duplicate storm", "## 5. Commit ceiling", "## 6. Scale", "## Targets"} {
		require.Contains(t, report, section)
	}
	require.Contains(t, report, "| acquisition is one round trip (new key, replay, in progress) | new key 1, replay 1, in progress 1 | met |")
	require.Contains(t, report, "| at most one round trip per phase beyond its own statements | at most 1 | met |")
	require.Contains(t, report, "| duplicate storm: exactly one execution every round | 2 of 2 rounds;")
	require.Contains(t, report, "| runner | new key | 7 | 7 |", "one round trip to acquire, two per phase")
	require.Contains(t, report, "reaper deleted 1000 keys")
	require.Contains(t, report, "Every point is measured in steady state.")
	require.Equal(t, 3, strings.Count(report, ": pg_prewarm ")+strings.Count(report, ": SELECTs read "), "each point says how it was prewarmed")
	for _, name := range []string{"runner / baseline throughput >= 0.85 at concurrency 4", "runner / single tx throughput >= 1.00 at concurrency 4",
		"replay / primary-key SELECT throughput >= 0.80 at concurrency 4", "WAL bytes per request: runner / baseline <= 1.2 at concurrency 4",
		"server CPU per request: runner / baseline <= 1.2 at concurrency 4", "acquisition p99 at 5k within 1.5x of 500",
		"acquisition p99 while reaping within 2x of without"} {
		require.Equal(t, 1, strings.Count(report, "| "+name+" | "), "one target row %q", name)
	}
	require.Contains(t, report, "| single tx | new key | 3 | 3 | 7 | 2 |", "three round trips, two transactions")
	require.Contains(t, report, "## 8. Citus: an indication on one box")
	if strings.Contains(report, "NOTE: Citus not installed") {
		t.Log("NOTE: Citus not installed: the Citus point NOT tested")
	} else {
		require.Contains(t, report, "| concurrency | plain req/s | Citus req/s | Citus / plain |")
		require.Contains(t, report, "The run's keys on Citus, warm-up included: ")
	}

	// The report and the plot, in the report directory and where -out and
	// -plot said.
	for _, path := range []string{filepath.Join(dir, "report", reportFile), filepath.Join(dir, "perf.md")} {
		written, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, report, string(written), path)
	}
	for _, path := range []string{filepath.Join(dir, "report", plotFile), filepath.Join(dir, "perf.png")} {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		_, err = png.Decode(bytes.NewReader(raw))
		require.NoError(t, err, path)
	}
}

// testEnv opens a benchmark environment for a test, the way a run does
// (DATABASE_URL, TEST_DATABASE_URL or a throwaway cluster), and closes it
// when the test ends.
func testEnv(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e, err := openEnv(ctx, envConfig{MaxConns: 4, Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.close()) })
	return e
}

// The single-transaction contender executes a new key in exactly two
// transactions (the claim, then everything else with the stored response),
// replays the stored body, and refuses a key whose claim is in progress.
func TestSingleContender(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, counter, err := countedPool(ctx, e)
	require.NoError(t, err)
	defer pool.Close()
	s := &single{pool: pool}
	in := rideInput{UserID: 7, Origin: "SF", Amount: 2500}

	from := counter.Position()
	first, err := s.run(ctx, "user:7", "k1", in)
	require.NoError(t, err)
	span := counter.Between(from, counter.Position())
	require.False(t, first.replayed)
	require.Equal(t, 201, first.status)
	require.Equal(t, 2, transactions(span.Statements), "the claim, then one transaction: %q", span.Statements)
	require.EqualValues(t, 3, own(span), "the three business statements")
	var resp rideResponse
	require.NoError(t, json.Unmarshal(first.body, &resp))
	require.Equal(t, in.Amount, resp.Amount)

	// The business rows and the key's finish committed together: one
	// transaction wrote them all.
	var keyXmin, rideXmin, jobXmin string
	var chargeID *string
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT k.xmin::text, r.xmin::text, j.xmin::text, r.charge_id
		FROM single_keys k JOIN single_rides r ON r.key_id = k.id JOIN single_jobs j ON j.ride_id = r.id
		WHERE k.scope = 'user:7' AND k.key = 'k1' AND k.locked_at IS NULL`).Scan(&keyXmin, &rideXmin, &jobXmin, &chargeID))
	require.Equal(t, keyXmin, rideXmin)
	require.Equal(t, keyXmin, jobXmin)
	require.NotNil(t, chargeID)
	require.Equal(t, resp.ChargeID, *chargeID)

	again, err := s.run(ctx, "user:7", "k1", in)
	require.NoError(t, err)
	require.True(t, again.replayed)
	require.Equal(t, 201, again.status)
	require.Equal(t, first.body, again.body, "the stored body, byte for byte")

	_, err = s.run(ctx, "user:7", "k1", rideInput{UserID: 7, Origin: "LA", Amount: 2500})
	require.ErrorIs(t, err, errKeyMismatch)

	// A claim that is in progress: the first request claimed the key and
	// has not finished. A second claim is refused and writes nothing.
	fp, err := baseFingerprint(in)
	require.NoError(t, err)
	var heldID int64
	require.NoError(t, pool.QueryRow(ctx, singleAcquireSQL, "user:7", "k2", fp).Scan(&heldID))
	_, err = s.run(ctx, "user:7", "k2", in)
	require.ErrorIs(t, err, errKeyInProgress)
	var rides int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM single_rides WHERE key_id = $1", heldID).Scan(&rides))
	require.Zero(t, rides)
}

func TestTransactionsCountsBlocksAndImplicitOnes(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0, transactions(nil))
	require.Equal(t, 2, transactions([]string{"INSERT 1", "begin", "INSERT 2", "UPDATE 3", "commit"}))
	require.Equal(t, 4, transactions([]string{"SELECT 1", "begin isolation level serializable", "x", "ROLLBACK", "select 2", "begin", "commit"}))
}

// The load targets judge the runner against the baseline and the
// single-transaction contender at the reference point; a server whose CPU
// is unknown leaves the CPU target unmeasured rather than missed.
func TestLoadTargets(t *testing.T) {
	t.Parallel()
	mk := func(ops int, wal float64, client, server time.Duration) *stats {
		return &stats{Ops: ops, Elapsed: time.Second, WALPerOp: wal, ClientCPU: client, ServerCPU: server}
	}
	ref := &loadPoint{Concurrency: 16, Stats: map[string]*stats{
		"runner":          mk(900, 1100, 300*time.Microsecond, 600*time.Microsecond),
		"baseline":        mk(1000, 1000, 200*time.Microsecond, 500*time.Microsecond),
		"single":          mk(1000, 900, 100*time.Microsecond, 300*time.Microsecond),
		"plain":           mk(800, 1000, 200*time.Microsecond, 500*time.Microsecond),
		"replay":          mk(700, 0, 0, 0),
		"select":          mk(1000, 0, 0, 0),
		"baseline-replay": mk(650, 0, 0, 0),
	}}
	got := map[string]target{}
	for _, tg := range loadTargets(ref) {
		got[tg.Name] = tg
	}
	require.Len(t, got, 7)
	check := func(name string, met bool, figure string) {
		t.Helper()
		tg, ok := got[name]
		require.True(t, ok, "a row %q in %v", name, got)
		require.Equal(t, met, tg.Met, name)
		require.False(t, tg.Unmeasured, name)
		require.Contains(t, tg.Figure, figure, name)
	}
	check("runner / baseline throughput >= 0.85 at concurrency 16", true, "0.90 (900 vs 1000 req/s)")
	check("runner / single tx throughput >= 1.00 at concurrency 16", false, "0.90 (900 vs 1000 req/s)")
	check("replay / primary-key SELECT throughput >= 0.80 at concurrency 16", false, "0.70")
	check("WAL bytes per request: runner / baseline <= 1.2 at concurrency 16", true, "1.10 (1100 vs 1000 B)")
	check("server CPU per request: runner / baseline <= 1.2 at concurrency 16", true, "1.20 (600 vs 500 µs); for information, client 1.50 (300 vs 200 µs), client+server 1.29 (900 vs 700 µs)")
	check("client CPU per request: runner / baseline <= 1.2 at concurrency 16", false, "1.50 (300 vs 200 µs)")
	check("replay / baseline replay throughput >= 1.00 at concurrency 16", true, "1.08 (700 vs 650/s)")

	ref.Stats["baseline"].ServerCPU = -1
	for _, tg := range loadTargets(ref) {
		if strings.HasPrefix(tg.Name, "server CPU") {
			require.True(t, tg.Unmeasured)
			require.Contains(t, tg.Figure, "client 1.50")
		}
	}
}

// -durable starts the throwaway cluster with durable commits, over pgtest's
// speed-over-durability defaults; a server the run did not start is only
// checked.
func TestDurableEnv(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := openEnv(ctx, envConfig{MaxConns: 2, Durable: true, Logf: t.Logf})
	if errors.Is(err, errNotDurable) {
		// Only a server we were given may say no, and it has been checked,
		// not changed.
		require.True(t, os.Getenv("DATABASE_URL") != "" || os.Getenv("TEST_DATABASE_URL") != "", "%v", err)
		return
	}
	require.NoError(t, err)
	defer func() { require.NoError(t, e.close()) }()
	info, err := describe(ctx, e.pool)
	require.NoError(t, err)
	set := map[string]string{}
	for _, kv := range info.Settings {
		set[kv[0]] = kv[1]
	}
	require.Equal(t, "on", set["fsync"])
	require.NotEqual(t, "off", set["synchronous_commit"])
	require.Equal(t, "on", set["full_page_writes"])
	require.Equal(t, "durable commits", durability(info.Settings).short)
}

func TestDurabilityInWords(t *testing.T) {
	t.Parallel()
	settings := func(fsync, sc, fpw string) [][2]string {
		return [][2]string{{"fsync", fsync}, {"full_page_writes", fpw}, {"shared_buffers", "128MB"}, {"synchronous_commit", sc}}
	}
	require.Equal(t, "durable commits", durability(settings("on", "on", "on")).short)
	require.Equal(t, "fsync off", durability(settings("off", "off", "off")).short)
	require.Equal(t, "fsync off", durability(settings("off", "on", "on")).short)
	require.Equal(t, "asynchronous commits", durability(settings("on", "off", "on")).short)
	require.Equal(t, "durable commits, full_page_writes off", durability(settings("on", "on", "off")).short)
	require.Contains(t, durability(settings("off", "off", "off")).long, "fsync=off, synchronous_commit=off, full_page_writes=off")
	require.Equal(t, "commits of unknown durability", durability(nil).short)
}

// Throughput is steady once a window is not more than 3% above the best
// before it, two windows in a row.
func TestSteadyRule(t *testing.T) {
	t.Parallel()
	steadyAfter := func(tps ...float64) int {
		r := &steadyRule{rise: 0.03, calm: 2}
		for i, tp := range tps {
			if r.add(tp) {
				return i + 1
			}
		}
		return -1
	}
	require.Equal(t, 3, steadyAfter(100, 100, 100), "the first window is never calm")
	require.Equal(t, 3, steadyAfter(100, 103, 90))
	require.Equal(t, 5, steadyAfter(100, 110, 120, 121, 119))
	require.Equal(t, 7, steadyAfter(100, 103, 120, 100, 125, 110, 111), "a rise of more than 3% starts the count again")
	require.Equal(t, -1, steadyAfter(100, 110, 121, 133, 146))
	require.Equal(t, "950 4.1k 12.3k", windowsText([]float64{950, 4100, 12345}))
	require.Equal(t, "40 ms", shortDuration(40*time.Millisecond))
	require.Equal(t, "2.5 s", shortDuration(2500*time.Millisecond))
}

// A scale point's table and indexes are prewarmed with pg_prewarm where it
// is available, and otherwise by SELECTs that read every page.
func TestPrewarm(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, generateKeys(ctx, e.pool, "idem_keys", 1, 300, 1, 30, t.Logf))
	_, err := e.pool.Exec(ctx, "VACUUM (ANALYZE) idem_keys")
	require.NoError(t, err)

	rels, err := tableRelations(ctx, e, "idem_keys")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(rels), 3)
	require.True(t, rels[0].index && rels[0].unique, "unique indexes first: %+v", rels)
	require.False(t, rels[len(rels)-1].index, "the heap last")
	for _, r := range rels[:len(rels)-1] {
		require.NotEmpty(t, r.columns, r.name)
	}

	what, _, err := (&prewarmer{}).warm(ctx, e, "idem_keys")
	require.NoError(t, err)
	require.Contains(t, what, fmt.Sprintf("SELECTs read %d relations", len(rels)))

	pw, err := newPrewarmer(ctx, e)
	require.NoError(t, err)
	require.Positive(t, pw.sharedBuffers)
	if pw.fn == "" {
		t.Skipf("pg_prewarm is not available: %s", pw.why)
	}
	what, _, err = pw.warm(ctx, e, "idem_keys")
	require.NoError(t, err)
	require.Contains(t, what, fmt.Sprintf("pg_prewarm 'buffer' all %d relations", len(rels)))
	pw.sharedBuffers = 0 // nothing fits: everything into the page cache
	what, _, err = pw.warm(ctx, e, "idem_keys")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(what, "pg_prewarm 'read' "), what)
}

// The profile section runs every path on one traced connection and, with
// the server on this machine, finds the runner's acquisition costing the
// backend CPU time.
func TestProfileSection(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := measureProfile(ctx, e, 3, 1)
	require.NoError(t, err)
	require.Len(t, rep.Paths, 7)
	paths := map[string]profilePath{}
	for _, pp := range rep.Paths {
		require.NotEmpty(t, pp.Rows, pp.Name)
		paths[pp.Name] = pp
	}
	runner, ok := paths["runner, new key"]
	require.True(t, ok, "%v", rep.Paths)
	// A new key is acquired, and committed, on its own.
	require.Equal(t, "acquisition (insert or report)", runner.Rows[0].Label)
	require.Equal(t, 1.0, runner.Rows[0].PerRequest)
	require.Len(t, runner.Rows, 7, "the acquisition and two round trips per phase: %+v", runner.Rows)
	require.Equal(t, "phase receipt_enqueued: guarded finish + COMMIT", runner.Rows[6].Label)
	require.Equal(t, "primary-key SELECT", paths["plain primary-key SELECT"].Rows[0].Label)
	if !rep.Measured {
		t.Logf("server CPU not measured: %s", rep.Why)
		require.Negative(t, runner.Rows[0].Server)
		require.Contains(t, renderProfile(rep), "not measured")
		return
	}
	require.Positive(t, runner.Rows[0].Server, "the backend's CPU time for the acquisition")
	require.Positive(t, runner.Server)
	out := renderProfile(rep)
	require.Contains(t, out, "## 7. Where the time goes")
	require.Contains(t, out, "| runner, new key | acquisition (insert or report) | 1 |")
}

func TestDescribeTrip(t *testing.T) {
	t.Parallel()
	require.Equal(t, "claim (INSERT ON CONFLICT)", describeTrip([]string{baseAcquireSQL}))
	require.Equal(t, "acquisition", describeTrip([]string{"SELECT * FROM s.idem_acquire($1, $2)"}))
	require.Equal(t, "acquisition (insert or report)", describeTrip([]string{"WITH clock AS (SELECT 1), ins AS (INSERT INTO s.idem_keys AS k VALUES (1)) SELECT 'created' AS acquired"}))
	require.Equal(t, "acquisition (look up)", describeTrip([]string{"WITH clock AS (SELECT 1)\nSELECT 'none' AS acquired, c.t FROM s.idem_keys k"}))
	require.Equal(t, "BEGIN + INSERT base_rides", describeTrip([]string{"begin", baseInsertRideSQL}))
	require.Equal(t, "INSERT single_jobs + finish key (UPDATE) + COMMIT", describeTrip([]string{insertJobSQL("single"), singleFinishSQL, "commit"}))
	require.Equal(t, "guarded finish", describeStatement("WITH guarded AS (\nUPDATE s.idem_keys\nSET status           = 'finished' WHERE id = $1) SELECT 1"))
	require.Equal(t, "guarded phase update", describeStatement("WITH guarded AS (UPDATE s.idem_keys SET status = 'running') SELECT 1"))
	require.Equal(t, "SELECT pg_backend_pid()", describeStatement("SELECT pg_backend_pid()"))
	// The store's transaction settings are part of BEGIN, not spelled out.
	require.Equal(t, "BEGIN + INSERT base_rides", describeTrip([]string{"begin", "SELECT set_config('statement_timeout', $1, true)", baseInsertRideSQL}))
	require.Equal(t, "DELETE idem_keys", describeStatement("DELETE FROM s.idem_keys WHERE id = $1"))
}

// Without Citus the section says so, loudly, instead of a table.
func TestCitusSectionWithoutCitus(t *testing.T) {
	out := renderCitus(&citusReport{Note: "NOTE: Citus not installed (no citus.so in /x/lib): the Citus point NOT measured"}, 2)
	require.Contains(t, out, "## 8. Citus: an indication on one box")
	require.Contains(t, out, "**NOTE: Citus not installed (no citus.so in /x/lib): the Citus point NOT measured.**")
	require.NotContains(t, out, "| concurrency |")
}
