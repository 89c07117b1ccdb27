package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/examples/rides/internal/demo"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/examples/rides/internal/simulate"
)

const (
	defaultRidesAddr   = "127.0.0.1:5004"
	defaultFakepayAddr = "127.0.0.1:5005"
)

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: use debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func serveCommand(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("serve", "Serves the rides API (POST /rides, GET /healthz) after applying the migrations\n"+
		"(idem's, the rides tables, River's) and seeding user@example.com and\n"+
		"user-bad-source@example.com. Works receipt jobs and runs idem's reaper,\n"+
		"completer and reconcile runs in-process.", stderr)
	env := &envError{}
	addr := fs.String("addr", envString("RIDES_ADDR", defaultRidesAddr), "address to listen on (RIDES_ADDR)")
	dbURL := fs.String("database-url", envString("DATABASE_URL", ""), "Postgres URL (DATABASE_URL); required")
	paymentsURL := fs.String("payments-url", envString("PAYMENTS_URL", "http://"+defaultFakepayAddr), "fakepay's base URL (PAYMENTS_URL)")
	lease := fs.Duration("lease", envDuration(env, "RIDES_LEASE", 90*time.Second),
		"how long a request holds its key without renewing; a crashed server's keys wait this long (RIDES_LEASE)")
	completeIdle := fs.Duration("complete-idle", envDuration(env, "RIDES_COMPLETE_IDLE", 5*time.Minute),
		"the completer finishes unfinished requests idle this long (RIDES_COMPLETE_IDLE)")
	completeInterval := fs.Duration("complete-interval", envDuration(env, "RIDES_COMPLETE_INTERVAL", time.Minute),
		"time between completer passes (RIDES_COMPLETE_INTERVAL)")
	reapInterval := fs.Duration("reap-interval", envDuration(env, "RIDES_REAP_INTERVAL", 5*time.Minute),
		"time between reaper passes, which delete finished keys past their 24h retention (RIDES_REAP_INTERVAL)")
	jobTimeout := fs.Duration("job-timeout", envDuration(env, "RIDES_JOB_TIMEOUT", time.Minute),
		"longest a receipt job may run (RIDES_JOB_TIMEOUT)")
	jobRescue := fs.Duration("job-rescue-after", envDuration(env, "RIDES_JOB_RESCUE_AFTER", time.Hour),
		"a job left running by a dead process is run again after this (RIDES_JOB_RESCUE_AFTER)")
	logLevel := fs.String("log-level", envString("RIDES_LOG_LEVEL", "info"), "debug, info, warn or error (RIDES_LOG_LEVEL)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := env.err(); err != nil {
		return err
	}
	logger, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	return ridesapp.Serve(ctx, &ridesapp.ServeConfig{
		Addr:        *addr,
		DatabaseURL: *dbURL,
		PaymentsURL: *paymentsURL,
		Lease:       *lease,
		Maintenance: idem.MaintainerConfig{
			ReapInterval:      *reapInterval,
			CompleteInterval:  *completeInterval,
			ReconcileInterval: -1, // the rides flow has no not-idempotent call to reconcile
			Complete:          idem.CompleteConfig{IdleFor: *completeIdle},
		},
		Queue:  ridesapp.QueueConfig{JobTimeout: *jobTimeout, RescueStuckJobsAfter: *jobRescue},
		Logger: logger,
	})
}

func fakepayCommand(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("fakepay", "Serves the fake payment provider: POST /v1/charges (honours Idempotency-Key),\n"+
		"GET /v1/charges (the ledger). Customer cus_bad_source is always declined.", stderr)
	env := &envError{}
	addr := fs.String("addr", envString("FAKEPAY_ADDR", defaultFakepayAddr), "address to listen on (FAKEPAY_ADDR)")
	failRate := fs.Float64("fail-rate", envFloat(env, "FAKEPAY_FAIL_RATE", 0), "share of charge requests answered 500 before charging (FAKEPAY_FAIL_RATE)")
	dropRate := fs.Float64("drop-rate", envFloat(env, "FAKEPAY_DROP_RATE", 0),
		"share of charges made and then answered by dropping the connection (FAKEPAY_DROP_RATE)")
	latency := fs.Duration("latency", envDuration(env, "FAKEPAY_LATENCY", 0), "delay before every answer (FAKEPAY_LATENCY)")
	logLevel := fs.String("log-level", envString("FAKEPAY_LOG_LEVEL", "info"), "debug, info, warn or error (FAKEPAY_LOG_LEVEL)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := env.err(); err != nil {
		return err
	}
	logger, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	provider, err := fakepay.New(&fakepay.Config{FailRate: *failRate, DropRate: *dropRate, Latency: *latency, Logger: logger})
	if err != nil {
		return err
	}
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	server := &http.Server{Handler: provider, ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- server.Serve(listener) }()
	logger.Info("fakepay: listening", "addr", "http://"+listener.Addr().String(),
		"fail_rate", *failRate, "drop_rate", *dropRate, "latency", *latency)
	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = server.Shutdown(shutdownCtx)
	return nil
}

func simulateCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("simulate", "Drives running rides servers with many faulty clients, then audits the API's\n"+
		"answers, the database and fakepay's ledger and prints the summary. Exits 1\n"+
		"when an invariant does not hold.", stderr)
	env := &envError{}
	urls := fs.String("url", envString("RIDES_URL", "http://"+defaultRidesAddr), "rides servers' base URLs, comma-separated (RIDES_URL)")
	dbURL := fs.String("database-url", envString("DATABASE_URL", ""), "the servers' Postgres URL, for the audit (DATABASE_URL); required")
	paymentsURL := fs.String("payments-url", envString("PAYMENTS_URL", "http://"+defaultFakepayAddr), "fakepay's base URL, for the audit (PAYMENTS_URL)")
	cfg := simulate.Config{}
	fs.IntVar(&cfg.Clients, "clients", 8, "requests in flight at once")
	fs.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long new requests are started")
	fs.IntVar(&cfg.Requests, "requests", 0, "stop after this many requests (0: no limit)")
	fs.Float64Var(&cfg.DeclinedShare, "declined-share", 0.1, "share of requests from the user whose card is declined")
	fs.Float64Var(&cfg.DuplicateShare, "duplicate-share", 0.1, "share of requests sent twice at once")
	fs.Float64Var(&cfg.TimeoutShare, "timeout-share", 0.1, "share of attempts with a client timeout shorter than the server's latency")
	fs.DurationVar(&cfg.ShortTimeout, "short-timeout", 10*time.Millisecond, "the impatient attempts' timeout")
	fs.DurationVar(&cfg.Drain, "drain", time.Minute, "how long unfinished requests and background work may take at the end")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := env.err(); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("a database URL is required for the audit (--database-url or DATABASE_URL)")
	}
	for u := range strings.SplitSeq(*urls, ",") {
		if u = strings.TrimRight(strings.TrimSpace(u), "/"); u != "" {
			cfg.Targets = append(cfg.Targets, u)
		}
	}
	// The flags' zero means zero here, where the Config's zero means
	// "default".
	for _, share := range []*float64{&cfg.DeclinedShare, &cfg.DuplicateShare, &cfg.TimeoutShare} {
		if *share == 0 {
			*share = -1
		}
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("connect to the database: %w", err)
	}
	defer pool.Close()
	cfg.Pool = pool
	cfg.Payments = &fakepay.Client{BaseURL: *paymentsURL}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))

	report, err := simulate.Run(ctx, &cfg)
	if err != nil {
		return err
	}
	if err := report.WriteSummary(stdout); err != nil {
		return err
	}
	if !report.OK() {
		fmt.Fprintf(stderr, "rides simulate: invariants violated: %s\n", strings.Join(report.Violations(), ", "))
		return exitError(1)
	}
	return nil
}

func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "Runs the whole example with nothing set up: a throwaway Postgres (unless\n"+
		"DATABASE_URL is set), fakepay with faults, serve processes and the\n"+
		"simulator; then prints the summary. Exits 0 exactly when every invariant\n"+
		"holds. Ctrl-C stops everything and removes the throwaway Postgres.", stderr)
	cfg := demo.Config{DatabaseURL: envString("DATABASE_URL", ""), Out: stdout}
	fs.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long the simulated clients start new requests")
	fs.IntVar(&cfg.Servers, "servers", 2, "serve processes")
	fs.IntVar(&cfg.Clients, "clients", 8, "requests in flight at once")
	fs.DurationVar(&cfg.KillEvery, "kill-every", 0, "SIGKILL a serve process at random moments around this interval, and restart it (0: never)")
	fs.Float64Var(&cfg.FailRate, "fail-rate", 0.05, "fakepay: share of charge requests answered 500")
	fs.Float64Var(&cfg.DropRate, "drop-rate", 0.05, "fakepay: share of charges answered by dropping the connection")
	fs.DurationVar(&cfg.Latency, "latency", 25*time.Millisecond, "fakepay: delay before every answer")
	fs.DurationVar(&cfg.Lease, "lease", 3*time.Second, "the servers' idem lease: how long a killed server's keys stay locked")
	fs.DurationVar(&cfg.Drain, "drain", 90*time.Second, "how long unfinished requests and background work may take at the end")
	fs.StringVar(&cfg.LogDir, "log-dir", "", "directory for the servers' logs (default: a new temporary directory)")
	if err := parse(fs, args); err != nil {
		return err
	}
	for _, v := range []*float64{&cfg.FailRate, &cfg.DropRate} {
		if *v == 0 {
			*v = -1
		}
	}
	if cfg.Latency == 0 {
		cfg.Latency = -1
	}
	result, err := demo.Run(ctx, &cfg)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := result.WriteSummary(stdout); err != nil {
		return err
	}
	if !result.OK() {
		fmt.Fprintf(stderr, "rides demo: invariants violated: %s (logs in %s)\n", strings.Join(result.Report.Violations(), ", "), result.LogDir)
		return exitError(1)
	}
	return nil
}
