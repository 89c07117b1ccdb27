package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/pgstore"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `Usage: webhooks serve [flags]

Serves POST /webhooks/stripe, which books Stripe-shaped signed events into a
ledger exactly once, and GET /healthz. Flags fall back to the environment:
DATABASE_URL, WEBHOOK_SECRET, WEBHOOKS_ADDR.
`

// run is the program; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] != "serve" {
		fmt.Fprintf(stderr, "webhooks: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", envOr("WEBHOOKS_ADDR", "127.0.0.1:5006"), "address to listen on")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres database (tables go in the schema its search_path names)")
	secret := fs.String("secret", os.Getenv("WEBHOOK_SECRET"), "the endpoint's signing secret")
	lease := fs.Duration("lease", 0, "idem lease (0: idem's default, 90s); a killed process holds its events this long")
	stall := fs.String("stall-phase", "", "fault injection: stall every event at the end of this phase, before its commit, until the process is killed")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "webhooks: unexpected arguments %q\n", fs.Args())
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if err := serve(ctx, serveConfig{addr: *addr, databaseURL: *dbURL, secret: *secret, lease: *lease, stallPhase: *stall, logger: logger, stdout: stdout}); err != nil {
		fmt.Fprintf(stderr, "webhooks: %v\n", err)
		return 1
	}
	return 0
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

type serveConfig struct {
	addr, databaseURL, secret string
	lease                     time.Duration
	stallPhase                string
	logger                    *slog.Logger
	stdout                    io.Writer
}

// defaultMaxConns sizes the pool when the URL does not (pool_max_conns).
const defaultMaxConns = 16

// serve runs the receiver until ctx ends, then lets the deliveries in
// flight finish (up to 10s).
func serve(ctx context.Context, cfg serveConfig) error {
	if cfg.databaseURL == "" {
		return errors.New("a database URL is required (--database-url or DATABASE_URL)")
	}
	if cfg.secret == "" {
		return errors.New("a signing secret is required (--secret or WEBHOOK_SECRET)")
	}
	poolConfig, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return err
	}
	if !strings.Contains(cfg.databaseURL, "pool_max_conns") {
		// A delivery holds up to two connections (its phase and its
		// lease's heartbeat), and a provider sends many at once.
		poolConfig.MaxConns = defaultMaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Migrate(ctx, pool, ""); err != nil {
		return err
	}
	var fault func(context.Context, string, Event)
	if cfg.stallPhase != "" {
		fault = func(ctx context.Context, phase string, ev Event) {
			if phase != cfg.stallPhase {
				return
			}
			fmt.Fprintf(cfg.stdout, "stalled: event %s at the end of %s\n", ev.ID, phase)
			<-make(chan struct{}) // until the process is killed
		}
	}
	receiver, err := NewReceiver("", fault)
	if err != nil {
		return err
	}
	store, err := pgstore.New(pool, nil)
	if err != nil {
		return err
	}
	defer store.Close()
	runner, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{receiver.Flow()}, Lease: cfg.lease, Logger: cfg.logger})
	if err != nil {
		return err
	}
	webhook, err := receiver.Handler(runner, &Verifier{Secrets: []string{cfg.secret}})
	if err != nil {
		return err
	}
	// The completer finishes events whose deliveries stopped half-way and
	// that the provider does not redeliver; the reaper deletes events past
	// their retention.
	maintainer, err := idem.NewMaintainer(runner, nil)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", webhook)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })

	l, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	// A delivery is small (1 MiB at most) and its event is handled in
	// well under a minute; the timeouts keep a slow or idle client from
	// holding a connection. An event whose answer is cut off by
	// WriteTimeout still finishes: the provider's redelivery gets its
	// stored response.
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
	maintained := make(chan error, 1)
	mctx, stopMaintainer := context.WithCancel(context.WithoutCancel(ctx))
	go func() { maintained <- maintainer.Serve(mctx) }()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	fmt.Fprintf(cfg.stdout, "webhooks: serving on %s (pid %d)\n", l.Addr(), os.Getpid())

	select {
	case err = <-served:
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = srv.Shutdown(shutdown)
		cancel()
	}
	stopMaintainer()
	<-maintained
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
