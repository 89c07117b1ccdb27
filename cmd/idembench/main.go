// Command idembench measures what idem costs, side by side with what it is
// measured against, in one run against one Postgres:
//
//  1. framework overhead: a three-phase flow shaped like rocket rides through
//     the runner, against a hand-rolled baseline that sends the same
//     statements in the same transactions with its own minimal key table,
//     and against a single-transaction contender (the shape of a
//     single-phase idempotency library: two commits per request);
//  2. round trips per request for a new key, a replay and an in-progress
//     answer, counted by a pgx tracer and on the socket;
//  3. the replay path against a plain primary-key SELECT on the same pool;
//  4. a duplicate storm: many identical requests at once, exactly one
//     execution;
//  5. the commit ceiling: the database's own single-row INSERT-and-commit
//     rate at the same concurrency;
//  6. scale: acquisition latency with 10 thousand and 10 million keys, and
//     while the reaper deletes a million expired ones, each point measured
//     in steady state (prewarmed, then warmed up until throughput stops
//     rising);
//  7. where the time goes: server CPU (the backend's schedstat) and wall time
//     per round trip of each path, and client CPU per request, one request
//     at a time on one traced connection;
//  8. Citus: the three-phase flow with keys spread over the workers of a
//     Citus cluster the run starts (a coordinator and two workers on this
//     machine) against the plain server, when Citus is installed: an
//     indication on one box.
//
// It prints a markdown report with the targets met or missed, and writes it
// with a PNG plot of throughput and latency against client concurrency into
// a directory (-report-dir, default idembench-report: report.md and
// performance.png). docs/performance.md quotes a run's figures; it is not
// generated.
//
//	go run ./cmd/idembench                # the full run, a few minutes
//	go run ./cmd/idembench -quick         # a smoke test
//	DATABASE_URL=postgres://... go run ./cmd/idembench -sections load
//
// Without DATABASE_URL it starts a throwaway cluster (internal/pgtest),
// which trades durability for speed (fsync=off, synchronous_commit=off):
// commit-bound figures are then CPU figures, not disk figures. -durable
// starts it with durable commits instead (with DATABASE_URL it only checks
// that the server has them). The report's heading says which. Either way
// the run works in a schema of its own that it drops at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/pgstore"
)

// options are the command's flags.
type options struct {
	Duration    time.Duration
	Warmup      time.Duration
	Rounds      int
	Concurrency []int
	Sections    map[string]bool
	Plot        string
	Out         string
	// ReportDir receives report.md and performance.png; empty: neither.
	ReportDir   string
	Quick       bool
	StormSize   int
	StormRounds int
	Scale       scaleConfig
	SyncCommit  string
	// SharedBuffers sizes the throwaway cluster's buffer cache; a
	// DATABASE_URL server is used as configured.
	SharedBuffers string
	// Durable starts the throwaway cluster with durable commits; a
	// DATABASE_URL server is only checked.
	Durable     bool
	CPUProfile  string
	MaxConns    int
	ReplayKeys  int
	ReferenceAt int
	Workloads   map[string]bool
	// ProfileN and ProfileWarmup are the profile section's repetitions
	// of each path, and its unmeasured warm-up runs before them.
	ProfileN      int
	ProfileWarmup int
}

var allSections = []string{"load", "roundtrips", "storm", "scale", "profile", "citus"}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	var conc, workloads, sections string
	fs.DurationVar(&o.Duration, "duration", 3*time.Second, "measured time per point and workload (split over -rounds)")
	fs.DurationVar(&o.Warmup, "warmup", 300*time.Millisecond, "unmeasured warm-up before each round of each point")
	fs.IntVar(&o.Rounds, "rounds", 2, "rounds per point; workloads alternate order each round")
	fs.StringVar(&conc, "concurrency", "1,4,16,64", "client concurrencies, comma-separated")
	fs.StringVar(&sections, "sections", strings.Join(allSections, ","), "sections to run: load (overhead, replay, commit ceiling), roundtrips, storm, scale, profile (server and client CPU per round trip), citus (the flow on a Citus cluster against the plain server, on this machine)")
	fs.StringVar(&workloads, "workloads", strings.Join(allWorkloads, ","), "load workloads to run (for profiling one alone); the report and plot need them all")
	fs.StringVar(&o.ReportDir, "report-dir", "idembench-report", "directory to write the run's "+reportFile+" and "+plotFile+" into, made if missing (empty: none)")
	fs.StringVar(&o.Plot, "plot", "", "also write the PNG plot to this file")
	fs.StringVar(&o.Out, "out", "", "also write the markdown report to this file")
	fs.BoolVar(&o.Quick, "quick", false, "smoke test: short points, a small scale table")
	fs.IntVar(&o.StormSize, "storm-size", 100, "identical requests per storm round")
	fs.IntVar(&o.StormRounds, "storm-rounds", 20, "storm rounds")
	fs.IntVar(&o.Scale.Small, "scale-small", 10_000, "keys in the small table")
	fs.IntVar(&o.Scale.Large, "scale-large", 10_000_000, "keys in the large table")
	fs.IntVar(&o.Scale.Expired, "scale-expired", 1_000_000, "expired keys among the large table's, for the reaper")
	fs.IntVar(&o.Scale.Concurrency, "scale-concurrency", 16, "acquiring workers in the scale section (half new keys, half replays)")
	fs.DurationVar(&o.Scale.ReapTimeout, "reap-timeout", 5*time.Minute, "give up on the reaper pass after this long")
	fs.DurationVar(&o.Scale.Steady.Window, "steady-window", time.Second, "scale: warm up in windows this long until throughput stops rising (a window at most 3% above the best before it, twice in a row)")
	fs.IntVar(&o.Scale.Steady.MaxWindows, "steady-max-windows", 30, "scale: measure anyway after this many warm-up windows")
	fs.StringVar(&o.SharedBuffers, "shared-buffers", "", "shared_buffers of the throwaway cluster, e.g. 2GB (ignored with DATABASE_URL); empty keeps pgtest's 128MB")
	fs.BoolVar(&o.Durable, "durable", false, "durable commits: start the throwaway cluster with fsync=on, synchronous_commit=on and full_page_writes=on (pgtest's defaults turn them off for speed); with DATABASE_URL (or TEST_DATABASE_URL) nothing is changed, the server is only checked and the run stops unless it has all three on")
	fs.StringVar(&o.SyncCommit, "synchronous-commit", "", "set synchronous_commit on every connection (on, off, ...); empty keeps the server's")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of this process to the file")
	fs.IntVar(&o.MaxConns, "max-conns", 0, "pool size; 0 sizes it for the largest concurrency and the storm")
	fs.IntVar(&o.ReplayKeys, "replay-keys", 2000, "finished keys the replay workloads pick from")
	fs.IntVar(&o.ProfileN, "profile-n", 300, "profile: measured requests per path (each pass)")
	fs.IntVar(&o.ProfileWarmup, "profile-warmup", 50, "profile: unmeasured requests per path before them")
	fs.IntVar(&o.ReferenceAt, "reference-concurrency", 16, "concurrency at which the ratio targets are judged")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.Quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		quick := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		quick("duration", func() { o.Duration = 200 * time.Millisecond })
		quick("warmup", func() { o.Warmup = 50 * time.Millisecond })
		quick("rounds", func() { o.Rounds = 1 })
		quick("storm-rounds", func() { o.StormRounds = 3 })
		quick("scale-small", func() { o.Scale.Small = 1000 })
		quick("scale-large", func() { o.Scale.Large = 100_000 })
		quick("scale-expired", func() { o.Scale.Expired = 10_000 })
		quick("reap-timeout", func() { o.Scale.ReapTimeout = time.Minute })
		quick("steady-window", func() { o.Scale.Steady.Window = 200 * time.Millisecond })
		quick("steady-max-windows", func() { o.Scale.Steady.MaxWindows = 15 })
		quick("replay-keys", func() { o.ReplayKeys = 200 })
		quick("profile-n", func() { o.ProfileN = 50 })
		quick("profile-warmup", func() { o.ProfileWarmup = 20 })
	}
	for _, f := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1000 {
			return nil, fmt.Errorf("-concurrency: %q is not a number from 1 to 1000", f)
		}
		o.Concurrency = append(o.Concurrency, n)
	}
	slices.Sort(o.Concurrency)
	o.Concurrency = slices.Compact(o.Concurrency)
	var err error
	if o.Sections, err = nameSet("-sections", "section", sections, allSections); err != nil {
		return nil, err
	}
	if o.Workloads, err = nameSet("-workloads", "workload", workloads, allWorkloads); err != nil {
		return nil, err
	}
	switch {
	case o.Duration <= 0 || o.Warmup < 0:
		return nil, errors.New("-duration must be positive and -warmup not negative")
	case o.Rounds < 1:
		return nil, errors.New("-rounds must be at least 1")
	case o.StormSize < 2 || o.StormRounds < 1:
		return nil, errors.New("-storm-size must be at least 2 and -storm-rounds at least 1")
	case o.Scale.Small < 1 || o.Scale.Large <= o.Scale.Small || o.Scale.Expired < 1 || o.Scale.Expired > o.Scale.Large-o.Scale.Small:
		return nil, errors.New("scale: need 1 <= -scale-small < -scale-large and 1 <= -scale-expired <= large - small")
	case o.Scale.Concurrency < 2:
		return nil, errors.New("-scale-concurrency must be at least 2")
	case o.Scale.Steady.Window <= 0 || o.Scale.Steady.MaxWindows < steadyCalm+1:
		return nil, fmt.Errorf("-steady-window must be positive and -steady-max-windows at least %d", steadyCalm+1)
	case o.ReplayKeys < 1:
		return nil, errors.New("-replay-keys must be positive")
	case o.ProfileN < 1 || o.ProfileWarmup < 0:
		return nil, errors.New("-profile-n must be positive and -profile-warmup not negative")
	case o.Durable && o.SyncCommit != "" && o.SyncCommit != "on":
		return nil, fmt.Errorf("-durable commits with synchronous_commit on, not %q", o.SyncCommit)
	}
	o.Scale.Duration = o.Duration
	if o.MaxConns == 0 {
		o.MaxConns = max(slices.Max(o.Concurrency), o.StormSize, o.Scale.Concurrency) + 4
	}
	return o, nil
}

// nameSet parses flag's comma-separated list of names, each one of known.
func nameSet(flag, what, list string, known []string) (map[string]bool, error) {
	set := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("%s: unknown %s %q (have %s)", flag, what, name, strings.Join(known, ", "))
		}
		set[name] = true
	}
	return set, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(1)
	}
}

// results is everything one run measured.
type results struct {
	Opts       *options
	Started    time.Time
	Took       time.Duration
	Source     string
	Where      string // where the server runs, relative to this process
	Server     *serverInfo
	LoadBefore string
	LoadAfter  string
	Load       []*loadPoint
	RoundTrips *roundTripReport
	Storm      *stormReport
	Scale      *scaleReport
	Profile    *profileReport
	Citus      *citusReport
}

// loadPoint is the side-by-side measurement at one concurrency.
type loadPoint struct {
	Concurrency int
	// Stats are each workload's figures, by name.
	Stats map[string]*stats
}

// workload returns the named workload's figures, nil if it did not run.
func (lp *loadPoint) workload(name string) *stats {
	return lp.Stats[name]
}

func run(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	res := &results{Opts: o, Started: time.Now(), LoadBefore: loadAverage()}
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	params := map[string]string{}
	if o.SyncCommit != "" {
		params["synchronous_commit"] = o.SyncCommit
	}
	e, err := openEnv(ctx, envConfig{MaxConns: o.MaxConns, RuntimeParams: params, SharedBuffers: o.SharedBuffers, Durable: o.Durable, Logf: logf})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := e.close(); cerr != nil {
			logf("idembench: cleaning up: %v", cerr)
		}
	}()
	res.Source = e.source
	res.Where = e.where
	if res.Server, err = describe(ctx, e.pool); err != nil {
		return err
	}
	logf("idembench: Postgres %s (%s), schema %s, pool of %d", res.Server.Version, e.source, e.schema, o.MaxConns)

	if o.Sections["load"] {
		if res.Load, err = measureLoad(ctx, e, o, logf); err != nil {
			return err
		}
	}
	if o.Sections["roundtrips"] {
		logf("idembench: counting round trips")
		if res.RoundTrips, err = measureRoundTrips(ctx, e); err != nil {
			return fmt.Errorf("round trips: %w", err)
		}
	}
	if o.Sections["storm"] {
		logf("idembench: duplicate storm, %d rounds of %d", o.StormRounds, o.StormSize)
		if res.Storm, err = measureStorm(ctx, e, o.StormSize, o.StormRounds); err != nil {
			return fmt.Errorf("storm: %w", err)
		}
	}
	if o.Sections["scale"] {
		logf("idembench: scale: %d then %d keys", o.Scale.Small, o.Scale.Large)
		if res.Scale, err = measureScale(ctx, e, o.Scale, logf); err != nil {
			return fmt.Errorf("scale: %w", err)
		}
	}
	if o.Sections["profile"] {
		logf("idembench: profile: %d requests per path, one at a time on one traced connection", o.ProfileN)
		if res.Profile, err = measureProfile(ctx, e, o.ProfileN, o.ProfileWarmup); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
	}
	if o.Sections["citus"] {
		logf("idembench: citus: the flow on a coordinator and two workers against the plain server")
		if res.Citus, err = measureCitus(ctx, e, o, logf); err != nil {
			return fmt.Errorf("citus: %w", err)
		}
	}
	res.Took = time.Since(res.Started)
	res.LoadAfter = loadAverage()

	report := renderReport(res)
	if _, err := io.WriteString(stdout, report); err != nil {
		return err
	}
	return writeFiles(o, res.Load, report, logf)
}

// The files of -report-dir.
const (
	reportFile = "report.md"
	plotFile   = "performance.png"
)

// writeFiles writes the report and the plot where the flags say: into
// -report-dir, and to -out and -plot.
func writeFiles(o *options, load []*loadPoint, report string, logf func(string, ...any)) error {
	reports, plots := []string{}, []string{}
	if o.ReportDir != "" {
		if err := os.MkdirAll(o.ReportDir, 0o755); err != nil {
			return err
		}
		reports = append(reports, filepath.Join(o.ReportDir, reportFile))
		plots = append(plots, filepath.Join(o.ReportDir, plotFile))
	}
	if o.Out != "" {
		reports = append(reports, o.Out)
	}
	if o.Plot != "" {
		plots = append(plots, o.Plot)
	}
	for _, path := range reports {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			return err
		}
		logf("idembench: wrote %s", path)
	}
	if len(load) == 0 {
		return nil // no load section: nothing to plot
	}
	for _, path := range plots {
		if err := writePlot(path, load); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		logf("idembench: wrote %s", path)
	}
	return nil
}

// measureLoad runs the side-by-side workloads at every concurrency.
func measureLoad(ctx context.Context, e *env, o *options, logf func(string, ...any)) ([]*loadPoint, error) {
	runner, store, err := newRunner(e.pool, e.schema, idem.Config{})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	deps := &loadDeps{pool: e.pool, runner: runner, run: randomHex(4)}

	// The replay workloads pick from finished keys made beforehand.
	logf("idembench: preparing %d finished keys to replay", o.ReplayKeys)
	flow := newRunnerFlow()
	deps.replayInputs = make([]rideInput, o.ReplayKeys)
	if err := forEach(ctx, 16, o.ReplayKeys, func(ctx context.Context, i int) error {
		deps.replayInputs[i] = rideInput{UserID: int64(i), Origin: "SF", Amount: int64(1000 + i)}
		_, err := runner.Execute(ctx, flow, idem.Request{Scope: "user:replay", Key: replayKey(i), Path: "/rides", Params: deps.replayInputs[i]})
		return err
	}); err != nil {
		return nil, fmt.Errorf("prepare replay keys: %w", err)
	}
	rows, err := e.pool.Query(ctx, "SELECT id FROM idem_keys WHERE scope = 'user:replay' AND status = 'finished'")
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		deps.replayIDs = append(deps.replayIDs, id)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(deps.replayIDs) != o.ReplayKeys {
		return nil, fmt.Errorf("prepared %d finished keys, want %d", len(deps.replayIDs), o.ReplayKeys)
	}
	// The baseline's replays, of the same requests through its own table.
	base := &baseline{pool: e.pool, pipelined: true}
	if err := forEach(ctx, 16, o.ReplayKeys, func(ctx context.Context, i int) error {
		_, err := base.run(ctx, "user:replay", replayKey(i), deps.replayInputs[i])
		return err
	}); err != nil {
		return nil, fmt.Errorf("prepare the baseline's replay keys: %w", err)
	}

	cpu, err := newCPUMeter(ctx, e.pool)
	if err != nil {
		return nil, err
	}
	if cpu.backends == nil {
		logf("idembench: the server's processes are not readable here; no server CPU figures")
	}

	var variants []variant
	for _, w := range workloads {
		if o.Workloads[w.name] {
			variants = append(variants, variant{w.name, w.op(deps)})
		}
	}
	// Warm every connection the measurements will use before any of them.
	poolWarmup := min(2*time.Second, o.Duration)
	logf("idembench: warming the pool: each workload at concurrency %d for %s", slices.Max(o.Concurrency), poolWarmup)
	if err := warmPool(ctx, slices.Max(o.Concurrency), poolWarmup, variants); err != nil {
		return nil, err
	}
	var points []*loadPoint
	for _, c := range o.Concurrency {
		logf("idembench: concurrency %d: %d workloads, %s each", c, len(variants), o.Duration)
		got, err := interleaved(ctx, c, o.Rounds, o.Warmup, o.Duration, variants, loadMeter(e, cpu))
		if err != nil {
			return nil, err
		}
		p := &loadPoint{Concurrency: c, Stats: got}
		var line []string
		for _, v := range variants {
			line = append(line, fmt.Sprintf("%s %.0f/s", v.name, got[v.name].Throughput()))
		}
		logf("idembench:   %s", strings.Join(line, ", "))
		points = append(points, p)
	}
	return points, nil
}

// loadMeter measures the WAL the server wrote during each run (from its
// WAL position around it) and the CPU time this process and the pool's
// backends spent.
func loadMeter(e *env, cpu *cpuMeter) runMeter {
	walPosition := func(ctx context.Context) (int64, error) {
		var pos int64
		err := e.pool.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::bigint").Scan(&pos)
		return pos, err
	}
	return func(ctx context.Context, _ variant) (func(*stats) error, error) {
		walBefore, err := walPosition(ctx)
		if err != nil {
			return nil, err
		}
		cpuBefore := cpu.sample()
		return func(s *stats) error {
			cpuAfter := cpu.sample()
			s.clientCPU, s.serverCPU = cpuAfter.client-cpuBefore.client, -1
			if cpuBefore.server >= 0 && cpuAfter.server >= 0 {
				s.serverCPU = cpuAfter.server - cpuBefore.server
			}
			walAfter, err := walPosition(ctx)
			s.walBytes = walAfter - walBefore
			return err
		}, nil
	}
}

// forEach runs fn for i in 0..n-1 on conc workers. After an error the
// remaining items are skipped.
func forEach(ctx context.Context, conc, n int, fn func(ctx context.Context, i int) error) error {
	next := make(chan int)
	errs := make(chan error, conc)
	for range conc {
		go func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					errs <- err
					for range next {
					}
					return
				}
			}
			errs <- nil
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	var err error
	for range conc {
		err = errors.Join(err, <-errs)
	}
	return err
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// newRunner opens a store on pool in schema and a runner on it with cfg,
// logging quietly unless cfg has a logger of its own. The caller closes the
// store.
func newRunner(pool *pgxpool.Pool, schema string, cfg idem.Config) (*idem.Runner, *pgstore.Store, error) {
	store, err := pgstore.New(pool, &pgstore.Config{Schema: schema})
	if err != nil {
		return nil, nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	runner, err := idem.NewRunner(store, &cfg)
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	return runner, store, nil
}

// quietLogger keeps the runner's logs out of the report; warnings still go
// to stderr.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
