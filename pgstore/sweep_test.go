package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

// sweepParams is an acquisition of key in flow "f", a day of retention.
func sweepParams(key string, now *time.Time) idemdriver.AcquireParams {
	return idemdriver.AcquireParams{Scope: "s", Key: key, Flow: "f", Method: "POST", Path: "/",
		Fingerprints: [][]byte{append([]byte{2}, make([]byte, 32)...)}, Params: []byte(`{}`),
		Lease: time.Minute, Retention: 24 * time.Hour, Now: now}
}

// commit commits one phase of the key ref holds: an advance to phase, or
// the finish when phase is empty.
func commit(t *testing.T, store *Store, ref idemdriver.LockRef, phase string, now *time.Time) {
	t.Helper()
	ctx := context.Background()
	tx, err := store.BeginPhase(ctx, idemdriver.PhaseOptions{})
	require.NoError(t, err)
	p := idemdriver.CommitParams{Ref: ref, RecoveryPoint: phase, Status: idemtype.StoredRunning,
		CheckpointPatch: map[string]json.RawMessage{"at": json.RawMessage(`"` + phase + `"`)}, Now: now}
	if phase == "" {
		p.Status, p.Response, p.Retention = idemtype.StoredFinished, &idemtype.Response{Status: 201, Body: []byte(`{"ok":true}`)}, 24*time.Hour
	}
	require.NoError(t, tx.CommitPhase(ctx, p))
}

// Every update a request makes to its key's row, each phase's advance and
// the finish, is HOT: no index on idem_keys names a column they write, so
// none gets an entry and the new tuple stays on its page. The server's own
// counters say so: the store runs on one connection, whose statistics are
// flushed (pg_stat_force_next_flush) before they are read.
func TestPhaseCommitsAndTheFinishAreHOT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, _ := storeOnOneConnection(t, schema, nil)
	updates := func() (all, hot int64) {
		_, err := store.db.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE relid = 'idem_keys'::regclass`).Scan(&all, &hot))
		return all, hot
	}
	for i := range 5 {
		res, err := store.Acquire(ctx, sweepParams(fmt.Sprintf("k%d", i), nil))
		require.NoError(t, err)
		require.Equal(t, idemdriver.AcquiredCreated, res.Acquired)
		ref := idemdriver.LockRef{ID: res.Record.ID, Fence: res.Record.Fence, Scope: "s"}
		all0, hot0 := updates()
		commit(t, store, ref, "ride_created", nil)
		commit(t, store, ref, "charged", nil)
		commit(t, store, ref, "", nil)
		all, hot := updates()
		require.Equal(t, int64(3), all-all0, "two advances and a finish")
		require.Equal(t, all-all0, hot-hot0, "every update of the key's row is HOT")
	}
}

// The sweep lists the keys still unfinished as its cursor passes them, and
// forgets them once they finish; the operations find unfinished keys below
// the cursor only through that list. On plain PostgreSQL and on Citus.
func TestSweepListsTheKeysStillUnfinished(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(t *testing.T) (*Store, *pgtest.Schema){
		"plain": func(t *testing.T) (*Store, *pgtest.Schema) {
			schema := pgtest.NewMigratedSchema(t)
			store, err := New(schema.Pool, &Config{Schema: schema.Name})
			require.NoError(t, err)
			t.Cleanup(store.Close)
			return store, schema
		},
		"citus": citusStore,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, schema := setup(t)
			store.sweepLag = 0
			now := time.Now()
			acquire := func(key string) idemdriver.LockRef {
				res, err := store.Acquire(ctx, sweepParams(key, &now))
				require.NoError(t, err)
				require.Equal(t, idemdriver.AcquiredCreated, res.Acquired, key)
				return idemdriver.LockRef{ID: res.Record.ID, Fence: res.Record.Fence, Scope: "s"}
			}
			stragglers := func() []int64 {
				var ids []int64
				require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(key_id ORDER BY key_id), '{}') FROM `+schema.Name+`.idem_stragglers`).Scan(&ids))
				return ids
			}
			window := func() unfinishedWindow {
				w, err := store.unfinished(ctx)
				require.NoError(t, err)
				return w
			}

			done := acquire("done")
			commit(t, store, done, "", &now)
			idle := acquire("idle")
			require.NoError(t, store.Release(ctx, idle, "gave up"))
			parked := acquire("parked")
			require.NoError(t, store.SetNeedsReconcile(ctx, parked, "in doubt"))
			later := acquire("later") // finishes after the sweep passed it

			// The first sweep stops where the migration's left it and sets
			// its next stop at the newest key; the second passes all four.
			window()
			w := window()
			require.Equal(t, later.ID, w.swept)
			require.Equal(t, []int64{idle.ID, parked.ID, later.ID}, stragglers(), "the unfinished keys, not the finished one")
			require.ElementsMatch(t, []int64{idle.ID, parked.ID, later.ID}, w.stragglers)

			// Below the cursor, every operation finds them.
			b, err := store.Backlog(ctx, idemdriver.BacklogParams{Now: &now})
			require.NoError(t, err)
			require.EqualValues(t, 2, b.Statuses[0].Keys, "running: idle and later")
			require.EqualValues(t, 1, b.Statuses[1].Keys, "needs_reconcile: parked")
			groups, err := store.UnfinishedKeys(ctx, []string{"f"})
			require.NoError(t, err)
			n := 0
			for _, g := range groups {
				n += g.Keys
			}
			require.Equal(t, 3, n)
			list, err := store.ListKeys(ctx, idemdriver.ListKeysParams{KeyQuery: idemtype.KeyQuery{State: idemtype.KeyStateNeedsReconcile, Limit: 10}, Now: &now})
			require.NoError(t, err)
			require.Len(t, list.Keys, 1)
			require.Equal(t, parked.ID, list.Keys[0].ID)
			soon := now.Add(time.Hour)
			claimed, err := store.ClaimIdle(ctx, idemdriver.ClaimIdleParams{Status: idemtype.StoredRunning, Flows: []string{"f"},
				IdleFor: time.Minute, Limit: 10, Now: &soon})
			require.NoError(t, err)
			require.Len(t, claimed, 2, "idle, and later whose first lease ran out")

			// A straggler that finishes is forgotten by the next sweep; one
			// the reaper deletes goes with its key.
			commit(t, store, later, "", &now)
			reaped, err := store.ReapUnfinished(ctx, idemdriver.ReapUnfinishedParams{After: time.Minute, Limit: 10, Now: &soon})
			require.NoError(t, err)
			require.Equal(t, 1, reaped.Deleted, "idle")
			window()
			require.Equal(t, []int64{parked.ID}, stragglers())
		})
	}
}

// The operations read the unfinished window, never the finished keys below
// the sweep's cursor, and the reaper reads the keys whose reap_after has
// passed, never those still in their retention: the statements run in a
// transaction whose own counters of the rows they read say how many.
func TestOperationsReadNoFinishedKeyOutsideTheirWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	store.sweepLag = 0
	const finished = 3000
	_, err = schema.Pool.Exec(ctx, `
		INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, status, recovery_point,
			response_status, finished_at, expires_at, reap_after, locked_at, lease_expires_at)
		SELECT 's', 'f' || i, 'f', 'POST', '/', '\x01', '{}', 'finished', 'finished', 201,
			now(), now() + interval '1 day', now() + interval '1 day', now(), now()
		FROM generate_series(1, $1) i`, finished)
	require.NoError(t, err)
	_, err = store.unfinished(ctx) // sets the next stop past them
	require.NoError(t, err)
	w, err := store.unfinished(ctx)
	require.NoError(t, err)
	require.EqualValues(t, finished, w.swept)
	for i := range 3 {
		res, err := store.Acquire(ctx, sweepParams(fmt.Sprintf("new%d", i), nil))
		require.NoError(t, err)
		require.NoError(t, store.Release(ctx, idemdriver.LockRef{ID: res.Record.ID, Fence: res.Record.Fence, Scope: "s"}, "gave up"))
	}
	_, err = schema.Pool.Exec(ctx, `ANALYZE idem_keys`)
	require.NoError(t, err)

	soon := time.Now().Add(time.Hour)
	read := func(sql string, args ...any) int64 {
		tx, err := schema.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		const counter = `SELECT pg_stat_get_xact_tuples_returned('idem_keys'::regclass) + pg_stat_get_xact_tuples_fetched('idem_keys'::regclass)`
		var before, after int64
		require.NoError(t, tx.QueryRow(ctx, counter).Scan(&before))
		rows, err := tx.Query(ctx, sql, args...)
		require.NoError(t, err)
		rows.Close()
		require.NoError(t, rows.Err())
		require.NoError(t, tx.QueryRow(ctx, counter).Scan(&after))
		return after - before
	}
	statements := map[string]func() (string, []any){
		"backlog": func() (string, []any) { return store.q.backlog, append([]any{nil}, w.args()...) },
		"unfinishedKeys": func() (string, []any) {
			return store.q.unfinishedKeys, append([]any{[]string{"f"}}, w.args()...)
		},
		"claimIdle": func() (string, []any) {
			return store.q.claimIdle, append([]any{&soon, "running", []string{"f"}, int64(1), 0, 10, "", ""}, w.args()...)
		},
		"leaseRowsAbandoned": func() (string, []any) {
			return store.q.leaseRowsAbandoned, append([]any{&soon, int64(1), []string{}, []int64{}, 10}, w.args()...)
		},
		"reapAbandoned": func() (string, []any) {
			return store.q.reapAbandoned, append([]any{&soon, int64(1), []string{}, []int64{}, 10}, w.args()...)
		},
		"reap": func() (string, []any) { return store.q.reap, []any{&soon, 1000} },
	}
	for name, statement := range statements {
		sql, args := statement()
		n := read(sql, args...)
		require.Less(t, n, int64(50), "%s read %d rows of idem_keys, of %d finished keys and 3 unfinished", name, n, finished)
	}
}
