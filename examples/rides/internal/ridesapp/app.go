package ridesapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// DefaultMinKeyLength is the shortest Idempotency-Key the API accepts, as in
// rocket-rides-atomic: a crude guard against keys like "1" that two clients
// could both pick. A UUID is 36 characters.
const DefaultMinKeyLength = 20

// Config configures an [App].
type Config struct {
	// Pool is the database. Required. Migrate must have run on it.
	Pool *pgxpool.Pool

	// Schema qualifies idem's, the rides and River's tables. Empty (the
	// default) uses the connections' search_path.
	Schema string

	// Payments charges rides. Required; a *fakepay.Client does.
	Payments Payments

	// PaymentsTimeout bounds one charge call. Default 10s. A call that
	// times out fails its phase, and the retry asks again with the same
	// downstream key.
	PaymentsTimeout time.Duration

	// Runner configures the idem runner (lease, retention, logger, test
	// hooks). Its Flows are replaced by the rides flow. Nil means defaults.
	Runner *idem.Config

	// Queue configures River.
	Queue QueueConfig

	// MinKeyLength is the shortest Idempotency-Key accepted. Default
	// DefaultMinKeyLength; negative means no minimum beyond one character.
	MinKeyLength int

	// Logger receives the app's logs. Default slog.Default().
	Logger *slog.Logger
}

// QueueConfig configures the River client that queues and works receipts.
type QueueConfig struct {
	// Work makes Start run the receipt worker in this process. Without it the
	// client only inserts jobs, for another process to work.
	Work bool

	// MaxWorkers bounds concurrent receipt jobs. Default 10.
	MaxWorkers int

	// JobTimeout and RescueStuckJobsAfter are River's: a job whose process
	// died mid-run is run again once RescueStuckJobsAfter has passed. Zero
	// means River's defaults (1 minute and 1 hour). The demo, which kills
	// processes on purpose, sets them short.
	JobTimeout           time.Duration
	RescueStuckJobsAfter time.Duration

	// PollOnly is River's: the client polls for jobs and leadership
	// instead of LISTENing, which a transaction pooler (PgBouncer
	// pool_mode=transaction) cannot carry. Serve sets it behind a pooler.
	PollOnly bool
}

// App is the rides service: its flow, the idem runner that drives it, the
// River client that queues and works receipts, and its HTTP handler.
type App struct {
	pool            *pgxpool.Pool
	schema          string
	prefix          string
	payments        Payments
	paymentsTimeout time.Duration
	minKeyLength    int
	logger          *slog.Logger
	work            bool
	// citus says idem's tables are distributed by scope (MigrateCitus):
	// the flow's statements then name the key's scope, rides' and
	// audit_records' distribution column, so they run on the key's worker.
	citus bool

	store   *pgstore.Store
	river   *river.Client[pgx.Tx]
	flow    *idem.Flow[RideParams]
	runner  *idem.Runner
	handler http.Handler
}

// New builds the app. It does not touch the database; call Migrate first and
// Start to work receipts.
func New(cfg *Config) (*App, error) {
	if cfg == nil || cfg.Pool == nil {
		return nil, errors.New("rides: Config.Pool is required")
	}
	if cfg.Payments == nil {
		return nil, errors.New("rides: Config.Payments is required")
	}
	prefix, err := migrations.QualifiedPrefix(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("rides: %w", err)
	}
	a := &App{
		pool:            cfg.Pool,
		schema:          cfg.Schema,
		prefix:          prefix,
		payments:        cfg.Payments,
		paymentsTimeout: cfg.PaymentsTimeout,
		minKeyLength:    cfg.MinKeyLength,
		logger:          cfg.Logger,
		work:            cfg.Queue.Work,
	}
	if a.paymentsTimeout == 0 {
		a.paymentsTimeout = 10 * time.Second
	}
	if a.minKeyLength == 0 {
		a.minKeyLength = DefaultMinKeyLength
	}
	if a.minKeyLength < 0 {
		a.minKeyLength = 1
	}
	if a.logger == nil {
		a.logger = slog.Default()
	}

	if a.store, err = pgstore.New(cfg.Pool, &pgstore.Config{Schema: cfg.Schema}); err != nil {
		return nil, fmt.Errorf("rides: %w", err)
	}
	a.citus = a.store.Distributed()

	workers := river.NewWorkers()
	river.AddWorker(workers, &ReceiptWorker{pool: cfg.Pool, prefix: prefix, logger: a.logger})
	riverConfig := &river.Config{
		Schema:               cfg.Schema,
		Workers:              workers,
		Logger:               a.logger,
		JobTimeout:           cfg.Queue.JobTimeout,
		RescueStuckJobsAfter: cfg.Queue.RescueStuckJobsAfter,
		PollOnly:             cfg.Queue.PollOnly,
	}
	if cfg.Queue.Work {
		maxWorkers := cfg.Queue.MaxWorkers
		if maxWorkers <= 0 {
			maxWorkers = 10
		}
		riverConfig.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}}
	}
	if a.river, err = river.NewClient(riverpgxv5.New(cfg.Pool), riverConfig); err != nil {
		return nil, fmt.Errorf("rides: river client: %w", err)
	}

	if a.flow, err = a.newFlow(); err != nil {
		return nil, err
	}
	runnerConfig := &idem.Config{}
	if cfg.Runner != nil {
		*runnerConfig = *cfg.Runner
	}
	if runnerConfig.Logger == nil {
		runnerConfig.Logger = a.logger
	}
	runnerConfig.Flows = []idem.AnyFlow{a.flow}
	if a.runner, err = idem.NewRunner(a.store, runnerConfig); err != nil {
		return nil, fmt.Errorf("rides: %w", err)
	}
	if a.handler, err = a.newHandler(); err != nil {
		return nil, err
	}
	return a, nil
}

// Flow returns the rides flow.
func (a *App) Flow() *idem.Flow[RideParams] { return a.flow }

// Runner returns the idem runner the app drives the flow with.
func (a *App) Runner() *idem.Runner { return a.runner }

// Store returns the idem store.
func (a *App) Store() *pgstore.Store { return a.store }

// River returns the River client.
func (a *App) River() *river.Client[pgx.Tx] { return a.river }

// Start starts working receipt jobs when Config.Queue.Work is set, and
// returns at once otherwise. The work stops with ctx or Stop.
func (a *App) Start(ctx context.Context) error {
	if !a.work {
		return nil
	}
	if err := a.river.Start(ctx); err != nil {
		return fmt.Errorf("rides: start river: %w", err)
	}
	return nil
}

// Stop stops the receipt worker, letting running jobs finish until ctx is
// done, and closes the store's control pool.
func (a *App) Stop(ctx context.Context) error {
	defer a.store.Close()
	if !a.work {
		return nil
	}
	if err := a.river.Stop(ctx); err != nil {
		return fmt.Errorf("rides: stop river: %w", err)
	}
	return nil
}
