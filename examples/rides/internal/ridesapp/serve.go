package ridesapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/rides/fakepay"
)

// ServeConfig configures [Serve].
type ServeConfig struct {
	// Addr is the address to listen on, e.g. 127.0.0.1:5004.
	Addr string
	// DatabaseURL is the Postgres database. Required.
	DatabaseURL string
	// PaymentsURL is fakepay's base URL. Required.
	PaymentsURL string
	// Lease is the idem runner's lease (Config.Lease). Zero means idem's
	// default, 90s. A process killed mid-request holds its keys this long.
	Lease time.Duration
	// Maintenance configures the reaper, completer and reconcile runs.
	Maintenance idem.MaintainerConfig
	// Queue configures River; Serve always sets Work.
	Queue QueueConfig
	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger
	// Ready, if set, is called with the listening address once the server
	// accepts connections.
	Ready func(addr string)
}

// defaultMaxConns sizes the pool when the URL does not: a request holds up
// to two connections (its phase and a heartbeat), and River and the
// maintainer want a few.
const defaultMaxConns = 24

// Serve runs the rides service until ctx is done: it applies the
// migrations, seeds the two users, and serves the API while working receipt
// jobs and running idem's maintenance in-process. On ctx's end it stops
// accepting requests, lets those in flight finish (up to 10s), stops the
// workers and returns nil.
func Serve(ctx context.Context, cfg *ServeConfig) error {
	if cfg.DatabaseURL == "" {
		return errors.New("rides: a database URL is required (--database-url or DATABASE_URL)")
	}
	if cfg.PaymentsURL == "" {
		return errors.New("rides: a payments URL is required (--payments-url or PAYMENTS_URL)")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}

	poolConfig, pooled, err := ParsePoolConfig(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
		poolConfig.MaxConns = defaultMaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		return fmt.Errorf("rides: connect to the database: %w", err)
	}
	defer pool.Close()

	if err := Migrate(ctx, pool, "", logger); err != nil {
		return err
	}
	if err := Seed(ctx, pool, ""); err != nil {
		return err
	}

	queue := cfg.Queue
	queue.Work = true
	// A transaction pooler hands each transaction any server connection:
	// River's LISTEN would land on one that others then use, and its
	// notifications arrive when no client is linked to it.
	queue.PollOnly = queue.PollOnly || pooled
	app, err := New(&Config{
		Pool: pool,
		Payments: &fakepay.Client{BaseURL: cfg.PaymentsURL, HTTPClient: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		}}},
		Runner: &idem.Config{Lease: cfg.Lease, Logger: logger},
		Queue:  queue,
		Logger: logger,
	})
	if err != nil {
		return err
	}
	maintainer, err := idem.NewMaintainer(app.Runner(), &cfg.Maintenance)
	if err != nil {
		return fmt.Errorf("rides: %w", err)
	}

	listener, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("rides: listen: %w", err)
	}
	server := &http.Server{
		Handler:           app.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}

	// The background work stops with its own context, after the server has
	// stopped taking requests.
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	if err := app.Start(workCtx); err != nil {
		_ = listener.Close()
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = maintainer.Serve(workCtx) })

	serveErr := make(chan error, 1)
	go func() { serveErr <- server.Serve(listener) }()
	logger.InfoContext(ctx, "rides: listening", "addr", "http://"+listener.Addr().String(), "payments", cfg.PaymentsURL)
	if cfg.Ready != nil {
		cfg.Ready(listener.Addr().String())
	}

	var result error
	select {
	case err := <-serveErr:
		result = fmt.Errorf("rides: serve: %w", err)
	case <-ctx.Done():
		logger.InfoContext(ctx, "rides: shutting down")
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := server.Shutdown(shutdownCtx); err != nil {
			logger.WarnContext(shutdownCtx, "rides: requests still in flight at shutdown", "err", err)
		}
		cancel()
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := app.Stop(stopCtx); err != nil {
		logger.WarnContext(stopCtx, "rides: stop receipt worker", "err", err)
	}
	stopWork()
	wg.Wait()
	return result
}
