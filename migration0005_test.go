package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// version4Acquire is the acquisition statement of the store that ran on
// version 4 of the schema, as it sent it (for a schema on the search_path).
// Version 5 moved the acquisition into the function idem_acquire; every other
// statement of the store is unchanged.
const version4Acquire = `
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), existing AS (
    SELECT k.id, k.request_id::text AS request_id, k.downstream_scheme, k.scope, k.key, k.flow, k.method, k.path,
        k.fingerprint, k.params, k.status, k.recovery_point, k.checkpoint,
        CASE WHEN k.status <> 'finished' AND l.foreign_mark_after = k.recovery_point
             THEN coalesce(l.foreign_mark, '') ELSE '' END AS foreign_mark,
        CASE WHEN k.status <> 'finished' THEN l.locked_at END AS locked_at,
        CASE WHEN k.status <> 'finished' THEN l.lease_expires_at END AS lease_expires_at, k.fence,
        coalesce(k.response_status, 0) AS response_status, coalesce(k.response_headers, '{}') AS response_headers,
        k.response_body, k.attempts, coalesce(k.last_error, '') AS last_error,
        k.created_at, k.last_run_at, k.finished_at, k.expires_at,
        coalesce(k.params_key_id, '') AS params_key_id, coalesce(k.response_key_id, '') AS response_key_id
    FROM idem_keys k LEFT JOIN LATERAL (SELECT * FROM idem_leases l WHERE l.key_id = k.id AND k.status <> 'finished' OFFSET 0) l ON true
    WHERE k.scope = $2 AND k.key = $3
), expired AS (
    DELETE FROM idem_keys d
    USING existing e
    WHERE NOT $10::boolean AND e.status = 'finished' AND e.expires_at <= (SELECT t FROM clock)
      AND d.id = e.id AND d.status = 'finished' AND d.expires_at <= (SELECT t FROM clock)
    RETURNING d.id
), inserted AS (
    INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, created_at, last_run_at, params_key_id)
    SELECT $2, $3, $4, $5, $6, $7, $8, clock.t, clock.t, nullif($11::text, '')
    FROM clock
    WHERE NOT $10::boolean AND (NOT EXISTS (SELECT 1 FROM existing) OR EXISTS (SELECT 1 FROM expired))
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING *
), leased AS (
    INSERT INTO idem_leases (key_id, fence, locked_at, lease_expires_at)
    SELECT inserted.id, inserted.fence, clock.t, clock.t + $9::bigint * interval '1 microsecond'
    FROM inserted, clock
    RETURNING *
)
SELECT 'created' AS acquired, (SELECT t FROM clock) AS db_now, inserted.id, inserted.request_id::text AS request_id,
    inserted.downstream_scheme, inserted.scope, inserted.key, inserted.flow, inserted.method, inserted.path,
    inserted.fingerprint, inserted.params, inserted.status, inserted.recovery_point, inserted.checkpoint,
    CASE WHEN inserted.status <> 'finished' AND leased.foreign_mark_after = inserted.recovery_point
         THEN coalesce(leased.foreign_mark, '') ELSE '' END AS foreign_mark,
    CASE WHEN inserted.status <> 'finished' THEN leased.locked_at END AS locked_at,
    CASE WHEN inserted.status <> 'finished' THEN leased.lease_expires_at END AS lease_expires_at, inserted.fence,
    coalesce(inserted.response_status, 0) AS response_status, coalesce(inserted.response_headers, '{}') AS response_headers,
    inserted.response_body, inserted.attempts, coalesce(inserted.last_error, '') AS last_error,
    inserted.created_at, inserted.last_run_at, inserted.finished_at, inserted.expires_at,
    coalesce(inserted.params_key_id, '') AS params_key_id, coalesce(inserted.response_key_id, '') AS response_key_id
FROM inserted JOIN leased ON leased.key_id = inserted.id
UNION ALL
SELECT 'none', clock.t, existing.* FROM existing, clock
WHERE NOT (existing.status = 'finished' AND existing.expires_at <= clock.t)`

// version4Store is the store as it ran on version 4: this store's statements,
// which are version 4's, except the acquisition. It creates and reports keys
// and takes none over, which is all this test asks of it.
type version4Store struct{ *pgstore.Store }

// AcquiresInPhase: version 4 acquires on its own (its Acquire), never with
// the current store's statement.
func (version4Store) AcquiresInPhase() bool { return false }

func (s version4Store) Acquire(ctx context.Context, p idemdriver.AcquireParams) (*idemdriver.AcquireResult, error) {
	for i := range 4 {
		var row struct {
			Acquired idemdriver.Acquisition `db:"acquired"`
			DBNow    time.Time              `db:"db_now"`
			idemdriver.KeyRecord
		}
		err := pgxscan.Get(ctx, s.DB(), &row, version4Acquire, p.Now, p.Scope, p.Key, p.Flow, p.Method, p.Path,
			p.Fingerprint, json.RawMessage(p.Params), p.Lease.Microseconds(), p.NoCreate, "")
		switch {
		case pgxscan.NotFound(err) && p.NoCreate:
			return &idemdriver.AcquireResult{Acquired: idemdriver.AcquiredNone}, nil
		case pgxscan.NotFound(err):
			continue
		case err != nil:
			return nil, err
		}
		return &idemdriver.AcquireResult{Acquired: row.Acquired, Record: &row.KeyRecord, DBNow: row.DBNow, Retried: i}, nil
	}
	return nil, errors.New("version 4 acquisition: no row")
}

// Keys written on version 4 carry on across migration 0005, which moves the
// acquisition into a function and changes nothing in the tables, and 0006,
// which turns the column checks into domains over the same types: a finished
// key replays, an expired one is replaced, a held one is in progress, one in
// needs_reconcile waits for its reconcile, and one left in flight by a
// crashed worker resumes after its last committed phase and finishes. Going
// back down leaves version 4's schema, on which version 4's store carries on.
func TestMigration0005KeepsKeysWorking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	// The statements the version 4 store shared with this one are made on
	// the current schema (New checks it), then the schema goes back to 4.
	_, err = m.Up(ctx)
	require.NoError(t, err)
	b := setupSMSOn(t, setupOn(t, schema))
	v4 := version4Store{b.storeFor(t)}
	atVersion := func(want int) {
		t.Helper()
		v, err := m.Version(ctx)
		require.NoError(t, err)
		require.Equal(t, want, v)
		var fn bool
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT to_regproc($1) IS NOT NULL`, schema.Name+".idem_acquire").Scan(&fn))
		require.Equal(t, want >= 5, fn, "idem_acquire exists from version 5 on")
	}
	_, err = m.Down(ctx, 4)
	require.NoError(t, err)
	atVersion(4)

	ride := rideInput{Origin: "SF", Amount: 20}
	crashing := false
	runnerOn := func(store idemdriver.Store, retention time.Duration) *idem.Runner {
		r, err := idem.NewRunner(store, &idem.Config{
			Flows: []idem.AnyFlow{b.testBundle.flow, b.flow}, Retention: retention,
			Test: idem.TestConfig{Now: b.clock.Now, Hook: func(_ context.Context, at idem.HookPoint) error {
				if crashing && at.Where == idem.HookAfterCommit && at.Phase == "ride_created" {
					return idem.ErrSimulatedCrash
				}
				return nil
			}},
		})
		require.NoError(t, err)
		return r
	}
	crash := func(r *idem.Runner, key string) {
		t.Helper()
		crashing = true
		defer func() { crashing = false }()
		_, err := r.Execute(ctx, b.testBundle.flow, b.request(key, ride))
		require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	}

	// Version 4: a key that expires, one left in flight by a crash whose
	// lease then runs out, one held by a live worker, a finished one and one
	// in needs_reconcile.
	old := runnerOn(v4, 24*time.Hour)
	expiredOut, err := runnerOn(v4, time.Hour).Execute(ctx, b.testBundle.flow, b.request("expired", ride))
	require.NoError(t, err)
	b.clock.Advance(2 * time.Hour)
	crash(old, "in-flight")
	b.clock.Advance(2 * time.Minute)
	crash(old, "held")
	finished, err := old.Execute(ctx, b.testBundle.flow, b.request("finished", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, finished.Kind)
	b.gateway.lose = true
	_, err = old.Execute(ctx, b.flow, b.req("reconcile"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	out, err := old.Execute(ctx, b.testBundle.flow, b.request("finished", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind, "version 4's acquisition works on version 4")
	// (Read with SQL of its own: this store's reads name version 7's
	// generation column.)
	var status, point string
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT status, recovery_point FROM `+schema.Name+`.idem_keys WHERE key = 'in-flight'`).Scan(&status, &point))
	require.Equal(t, string(idem.StatusRunning), status)
	require.Equal(t, "ride_created", point)

	// The latest version (0005 and 0006 applied to what version 4 left),
	// with a store made for it.
	_, err = m.Up(ctx)
	require.NoError(t, err)
	atVersion(migrations.Latest())
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	r := runnerOn(store, 24*time.Hour)

	out, err = r.Execute(ctx, b.testBundle.flow, b.request("finished", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, finished.Response.Body, out.Response.Body)
	require.Equal(t, finished.Record.ID, out.Record.ID)

	out, err = r.Execute(ctx, b.testBundle.flow, b.request("expired", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind, "an expired key is not replayed")
	require.NotEqual(t, expiredOut.Record.ID, out.Record.ID, "a new row replaced it")

	out, err = r.Execute(ctx, b.testBundle.flow, b.request("held", ride))
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, out.Kind)

	out, err = r.Execute(ctx, b.flow, b.req("reconcile"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	out, err = r.Reconcile(ctx, "user:1", "reconcile")
	require.NoError(t, err, "the message was never sent: the phase runs again")
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "reconcile")))

	before := b.counts.Get()
	out, err = r.Execute(ctx, b.testBundle.flow, b.request("in-flight", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	after := b.counts.Get()
	require.Equal(t, before["ride_created"], after["ride_created"], "resumed after ride_created")
	require.Equal(t, before["charge_created"]+1, after["charge_created"])
	require.Equal(t, before["receipt_enqueued"]+1, after["receipt_enqueued"])

	b.clock.Advance(2 * time.Minute)
	out, err = r.Execute(ctx, b.testBundle.flow, b.request("held", ride))
	require.NoError(t, err, "the held key, once its lease ran out")
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, 5, b.countRows(t, "rides"), "a ride each for expired (twice), in-flight, held and finished")
	require.Zero(t, b.countRows(t, "rides WHERE charge_id IS NULL"))

	// Back to version 4: version 4's store carries on with what the latest
	// version wrote.
	_, err = m.Down(ctx, 4)
	require.NoError(t, err)
	atVersion(4)
	for _, key := range []string{"finished", "in-flight", "held"} {
		out, err = old.Execute(ctx, b.testBundle.flow, b.request(key, ride))
		require.NoError(t, err, key)
		require.Equal(t, idem.OutcomeReplayed, out.Kind, key)
	}
	out, err = old.Execute(ctx, b.testBundle.flow, b.request("new-at-4", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
}

// A connection that has called idem_acquire keeps acquiring across
// migration 0006 and back: PL/pgSQL keeps a function compiled per session
// with the column types it saw, and the migration makes every session
// compile it afresh rather than fail every later call. (idem_acquire is what
// the stores of versions 5 and 6 call; it is called here as they did.)
func TestAcquireOnOneConnectionAcrossMigration0006(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	conn, err := schema.Pool.Acquire(ctx) // every acquisition on the same session
	require.NoError(t, err)
	defer conn.Release()
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)

	acquire := func(key string) {
		t.Helper()
		for _, want := range []string{"created", "none"} {
			var acquired string
			require.NoError(t, conn.QueryRow(ctx, `SELECT acquired FROM `+schema.Name+`.idem_acquire(NULL, 's', $1, 'f', 'POST', '/', '\x01', '{}', 60000000, false, '')`, key).Scan(&acquired), key)
			require.Equal(t, want, acquired, key)
		}
	}
	_, err = m.Down(ctx, 6)
	require.NoError(t, err)
	acquire("at-6")
	_, err = m.Down(ctx, 5)
	require.NoError(t, err)
	acquire("at-5")
	up6, err := m.Script(migrations.FormatSQL, migrations.DirectionUp, 6)
	require.NoError(t, err)
	_, err = schema.Pool.Exec(ctx, up6)
	require.NoError(t, err)
	acquire("at-6-again")
}
