package simulate

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type testBundle struct {
	schema   *pgtest.Schema
	provider *fakepay.Server
	config   *Config
}

// setup runs the rides app (with its receipt worker) and a faulty fakepay
// in-process, and returns a simulation config aimed at them.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	schema := pgtest.NewSchema(t)
	require.NoError(t, ridesapp.Migrate(ctx, schema.Pool, schema.Name, logger))
	require.NoError(t, ridesapp.Seed(ctx, schema.Pool, schema.Name))
	provider, err := fakepay.New(&fakepay.Config{FailRate: 0.1, DropRate: 0.1, Latency: 15 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	providerServer := httptest.NewServer(provider)
	t.Cleanup(providerServer.Close)
	payments := &fakepay.Client{BaseURL: providerServer.URL}

	app, err := ridesapp.New(&ridesapp.Config{
		Pool: schema.Pool, Schema: schema.Name, Payments: payments,
		// A short lease as in the demo: a 409's Retry-After is the time
		// left on the holder's lease, which the clients honour.
		Runner: &idem.Config{Lease: 3 * time.Second},
		Queue:  ridesapp.QueueConfig{Work: true}, Logger: logger,
	})
	require.NoError(t, err)
	require.NoError(t, app.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, app.Stop(ctx))
	})
	api := httptest.NewServer(app.Handler())
	t.Cleanup(api.Close)
	return &testBundle{schema: schema, provider: provider, config: &Config{
		Targets:  []string{api.URL},
		Clients:  4,
		Duration: time.Minute,
		Requests: 40,
		Drain:    time.Minute,
		Pool:     schema.Pool,
		Schema:   schema.Name,
		Payments: payments,
		Logger:   logger,
	}}
}

// A run against a healthy service: every request reaches its final status
// and every invariant holds, faults and all.
func TestRunAuditsAHealthyService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	report, err := Run(context.Background(), b.config)
	require.NoError(t, err)
	require.True(t, report.OK(), "violations: %v", report.Violations())
	require.Equal(t, 40, report.Requests)
	require.Equal(t, 40, report.Succeeded+report.Declined)
	require.Equal(t, 40, report.Rides)
	require.Equal(t, 4, report.Declined, "DeclinedShare (0.1) of the requests, exactly: a short run on a loaded machine still has some")
	require.Equal(t, report.Succeeded, report.ChargesInLedger)
	require.GreaterOrEqual(t, report.Attempts, report.Requests+report.Duplicates)
	require.Positive(t, report.P50LatencyMS)
	require.Positive(t, report.Throughput)

	// A second run against the same database and ledger audits only
	// itself.
	b.config.Requests = 10
	again, err := Run(context.Background(), b.config)
	require.NoError(t, err)
	require.True(t, again.OK(), "violations: %v", again.Violations())
	require.Equal(t, 10, again.Rides)
}

// Every client sends a request, however short the run: a run whose window
// has passed before the clients start (the database slow to answer the
// simulator's first query, on a loaded machine) still has something to
// audit, rather than a report of no requests at all.
func TestEveryClientSendsARequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.config.Duration = time.Nanosecond
	report, err := Run(context.Background(), b.config)
	require.NoError(t, err)
	require.True(t, report.OK(), "violations: %v", report.Violations())
	require.Equal(t, b.config.Clients, report.Requests)
	require.Equal(t, 1, report.Declined, "the first request is the declined user's")
}

// The audit finds each kind of damage it is there to find.
func TestAuditFindsViolations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg, err := b.config.withDefaults()
	require.NoError(t, err)
	cfg.DeclinedShare, cfg.DuplicateShare, cfg.TimeoutShare = 0, 0, 0
	s := &simulator{cfg: cfg, started: time.Now()}
	require.NoError(t, cfg.Pool.QueryRow(ctx, `SELECT now()`).Scan(&s.since))
	var requests []*request
	for n := range int64(5) {
		q := s.newRequest(n)
		s.send(ctx, q)
		requests = append(requests, q)
	}
	audit := func() *Report {
		t.Helper()
		r := s.tally(requests, time.Now())
		// A deadline already past: report what is there without waiting.
		require.NoError(t, s.audit(ctx, time.Now(), requests, r))
		return r
	}
	// Receipt jobs are worked in the background; wait (bounded) for them.
	require.NoError(t, s.audit(ctx, time.Now().Add(time.Minute), requests, &Report{}))
	require.True(t, audit().OK())

	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := b.schema.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	var rideIDs []int64
	var references []string
	rows, err := b.schema.Pool.Query(ctx, `SELECT id, charge_reference FROM rides ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var reference string
		require.NoError(t, rows.Scan(&id, &reference))
		rideIDs = append(rideIDs, id)
		references = append(references, reference)
	}
	require.NoError(t, rows.Err())
	require.Len(t, rideIDs, 5)

	// charge makes a charge behind the service's back, retrying the
	// provider's injected faults with the same key.
	charge := func(key, description string) {
		t.Helper()
		for range 50 {
			_, err := cfg.Payments.CreateCharge(ctx, key, fakepay.ChargeParams{Amount: 2000, Currency: "usd", Customer: "cus_x", Description: description})
			if err == nil {
				return
			}
			require.False(t, fakepay.IsPermanent(err), "%v", err)
		}
		t.Fatalf("could not charge %s", key)
	}
	// A second charge for a ride, under another key.
	charge("rogue-1", ridesapp.ChargeDescription(references[0]))
	// A charge for no ride at all.
	charge("rogue-2", ridesapp.ChargeDescription("idem-no-such-ride"))
	// A ride that lost its charge, a receipt that was never written, a key
	// left unfinished, and an answer that no longer matches the database.
	exec(`UPDATE rides SET charge_id = NULL, payment_status = 'failed' WHERE id = $1`, rideIDs[1])
	exec(`DELETE FROM receipts WHERE ride_id = $1`, rideIDs[2])
	exec(`UPDATE idem_keys SET status = 'running', response_status = NULL, finished_at = NULL, expires_at = NULL
		WHERE id = (SELECT idempotency_key_id FROM rides WHERE id = $1)`, rideIDs[3])
	requests[4].response = []byte(`{"ride_id": 1, "charge_id": "ch_elsewhere"}`)

	r := audit()
	require.Equal(t, 1, r.DoubleCharges)
	// The lost charge is both: a ride without its charge, and a charge
	// recorded on no ride; plus the charge for no ride at all.
	require.Equal(t, 1, r.RidesWithoutCharge)
	require.Equal(t, 2, r.ChargesWithoutRide)
	require.Equal(t, 1, r.ReceiptsMissing)
	require.Equal(t, 1, r.StuckKeys)
	require.GreaterOrEqual(t, r.Disagreeing, 2, "the ride without charge and the altered answer")
	require.False(t, r.OK())
	require.ElementsMatch(t, []string{"answers disagreeing with database", "double charges", "rides without charge",
		"charges without ride", "receipts missing", "stuck keys"}, r.Violations())
}
