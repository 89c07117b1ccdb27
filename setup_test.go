package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

func TestMain(m *testing.M) {
	if os.Getenv(killedChildEnv) == "1" {
		os.Exit(runKilledChild())
	}
	pgtest.Main(m)
}

// testBundle is what most tests need: a migrated schema of their own, a
// store on it, a controllable clock and a flow shaped like rocket rides.
type testBundle struct {
	schema   *pgtest.Schema
	pool     *pgxpool.Pool
	store    *pgstore.Store
	clock    *idemtest.Clock
	provider *testfixture.Provider
	counts   *testfixture.PhaseCounts
	flow     *idem.Flow[rideInput]
	// hooks lets a test inject behaviour into the flow's phases by name;
	// set it before running.
	hooks map[string]func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error
	// scoped says rides and jobs carry the key's scope, the column they are
	// distributed by on Citus (setupCitus), and every phase names it.
	scoped bool
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	return setupOn(t, pgtest.NewMigratedSchema(t))
}

// setupOn is setup on a schema the caller migrated (to an older version, say).
func setupOn(t *testing.T, schema *pgtest.Schema) *testBundle {
	t.Helper()
	ctx := context.Background()
	_, err := schema.Pool.Exec(ctx, `
		CREATE TABLE rides (id bigserial PRIMARY KEY, key_id bigint REFERENCES idem_keys (id) ON DELETE SET NULL,
		                    origin text NOT NULL, charge_id text);
		CREATE TABLE jobs (id bigserial PRIMARY KEY, ride_id bigint NOT NULL, kind text NOT NULL)`)
	require.NoError(t, err)
	b := &testBundle{
		schema: schema, pool: schema.Pool,
		clock:    idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		provider: &testfixture.Provider{}, counts: &testfixture.PhaseCounts{},
		hooks: map[string]func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error{},
	}
	b.flow = b.rideFlow("rides.create")
	return b
}

// storeFor returns the bundle's store, made on first use: a store checks
// that its schema is current, so a bundle on an older schema gets its store
// once the test has migrated it.
func (b *testBundle) storeFor(t *testing.T) *pgstore.Store {
	t.Helper()
	if b.store == nil {
		store, err := pgstore.New(b.schema.Pool, &pgstore.Config{Schema: b.schema.Name})
		require.NoError(t, err)
		t.Cleanup(store.Close)
		b.store = store
	}
	return b.store
}

// storeOn returns a store on a pool of its own over schema, set up by tune
// (its size, runtime parameters, a tracer) before it connects: a process
// with settings of its own.
func storeOn(t *testing.T, schema *pgtest.Schema, tune func(*pgxpool.Config)) *pgstore.Store {
	t.Helper()
	return storeAt(t, schema.URL, schema.Name, tune)
}

// storeAt is storeOn with the pool connecting to url (through a pooler,
// say), the store's tables in schema.
func storeAt(t *testing.T, url, schema string, tune func(*pgxpool.Config)) *pgstore.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	tune(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgstore.New(pool, &pgstore.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	return store
}

// runner returns a new runner, as a new process would make one. Each test
// runner uses the bundle's clock so leases expire on command.
func (b *testBundle) runner(t *testing.T, cfg *idem.Config) *idem.Runner {
	t.Helper()
	if cfg == nil {
		cfg = &idem.Config{}
	}
	if cfg.Test.Now == nil {
		cfg.Test.Now = b.clock.Now
	}
	if len(cfg.Flows) == 0 {
		cfg.Flows = []idem.AnyFlow{b.flow}
	}
	r, err := idem.NewRunner(b.storeFor(t), cfg)
	require.NoError(t, err)
	return r
}

type rideInput struct {
	Origin string  `json:"origin"`
	Amount float64 `json:"amount"`
}

func (b *testBundle) request(key string, in rideInput) idem.Request {
	return idem.Request{Scope: "user:1", Key: key, Method: "POST", Path: "/rides", Params: in}
}

// rideFlow mirrors rocket-rides-atomic: create a ride, charge it through an
// idempotent provider, enqueue a receipt job and respond 201 (or store a
// 402 when the provider declines).
func (b *testBundle) rideFlow(name string) *idem.Flow[rideInput] {
	return b.rideFlowConfig(name, nil)
}

// rideFlowConfig is rideFlow with the flow's optional settings.
func (b *testBundle) rideFlowConfig(name string, config *idem.FlowConfig[rideInput]) *idem.Flow[rideInput] {
	hook := func(phase string, ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		b.counts.Add(phase)
		if h := b.hooks[phase]; h != nil {
			return h(ctx, tx, run)
		}
		return nil
	}
	return idem.MustNewFlow(name, []idem.Phase[rideInput]{
		{
			Name: "ride_created",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
				if err := hook("ride_created", ctx, tx, run); err != nil {
					return idem.Result{}, err
				}
				var id int64
				sql, args := `INSERT INTO rides (key_id, origin) VALUES ($1, $2) RETURNING id`, []any{run.Key().ID, run.Input().Origin}
				if b.scoped {
					sql, args = `INSERT INTO rides (key_id, origin, scope) VALUES ($1, $2, $3) RETURNING id`, append(args, run.Key().Scope)
				}
				if err := tx.QueryRow(ctx, sql, args...).Scan(&id); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), run.SetCheckpoint("ride_id", id)
			},
		},
		{
			Name: "charge_created",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
				if err := hook("charge_created", ctx, tx, run); err != nil {
					return idem.Result{}, err
				}
				var rideID int64
				if ok, err := run.Checkpoint("ride_id", &rideID); err != nil || !ok {
					return idem.Result{}, fmt.Errorf("no ride_id checkpoint (found %v): %v", ok, err)
				}
				var chargeID string
				err := run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
					var err error
					chargeID, err = b.provider.Charge(key, run.Input().Amount)
					return err
				})
				if err == testfixture.ErrDeclined {
					return idem.RespondJSON(http.StatusPaymentRequired, map[string]any{"error": "card_declined", "ride_id": rideID}), nil
				}
				if err != nil {
					return idem.Result{}, err
				}
				sql, args := `UPDATE rides SET charge_id = $1 WHERE id = $2`, []any{chargeID, rideID}
				if b.scoped {
					sql, args = `UPDATE rides SET charge_id = $1 WHERE id = $2 AND scope = $3`, append(args, run.Key().Scope)
				}
				if _, err := tx.Exec(ctx, sql, args...); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), run.SetCheckpoint("charge_id", chargeID)
			},
		},
		{
			Name: "receipt_enqueued",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
				if err := hook("receipt_enqueued", ctx, tx, run); err != nil {
					return idem.Result{}, err
				}
				var rideID int64
				var chargeID string
				if _, err := run.Checkpoint("ride_id", &rideID); err != nil {
					return idem.Result{}, err
				}
				if _, err := run.Checkpoint("charge_id", &chargeID); err != nil {
					return idem.Result{}, err
				}
				sql, args := `INSERT INTO jobs (ride_id, kind) VALUES ($1, 'receipt')`, []any{rideID}
				if b.scoped {
					sql, args = `INSERT INTO jobs (ride_id, kind, scope) VALUES ($1, 'receipt', $2)`, append(args, run.Key().Scope)
				}
				if _, err := tx.Exec(ctx, sql, args...); err != nil {
					return idem.Result{}, err
				}
				return idem.Respond(http.StatusCreated,
					http.Header{"Content-Type": {"application/json"}, "X-Ride": {fmt.Sprint(rideID)}, "Set-Cookie": {"session=1"}},
					fmt.Appendf(nil, `{"ride_id": %d,  "charge_id": %q}`, rideID, chargeID)), nil
			},
		},
	}, config)
}

// countRows counts rows of a business table, optionally filtered.
func (b *testBundle) countRows(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

func (b *testBundle) key(t *testing.T, key string) *idemtype.KeyRecord {
	t.Helper()
	rec, err := b.storeFor(t).GetKey(context.Background(), "user:1", key)
	require.NoError(t, err)
	return rec
}

func decodeBody(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m))
	return m
}

// executed is how an Execute ended.
type executed struct {
	out *idem.Outcome
	err error
}

// startPausedIn executes req on a runner made with cfg, its phase pausing
// on its first run until release is called, and returns once it paused;
// done gets how the request ended. It is the one way a test holds a key
// in a phase.
func startPausedIn(t *testing.T, b *testBundle, phase string, cfg *idem.Config, req idem.Request) (done <-chan executed, release func()) {
	t.Helper()
	pause := testfixture.NewPause(t)
	b.hooks[phase] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		pause.Hold(context.Background())
		return nil
	}
	ended := make(chan executed, 1)
	r := b.runner(t, cfg)
	go func() {
		o, err := r.Execute(context.Background(), b.flow, req)
		ended <- executed{o, err}
	}()
	select {
	case <-pause.Reached():
	case e := <-ended:
		t.Fatalf("the first request ended before pausing in %s: %v", phase, e.err)
	}
	return ended, pause.Release
}
