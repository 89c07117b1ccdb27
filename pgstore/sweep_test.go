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

// plainStore is a store on a schema of its own, migrated, on plain
// PostgreSQL (citusStore's twin), configured by cfg (nil: the defaults)
// with the schema's name.
func plainStore(t *testing.T, cfg *Config) (*Store, *pgtest.Schema) {
	t.Helper()
	schema := pgtest.NewMigratedSchema(t)
	if cfg == nil {
		cfg = &Config{}
	}
	cfg.Schema = schema.Name
	store, err := New(schema.Pool, cfg)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	return store, schema
}

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

// sweepPast sweeps until the cursor is at id or past it: a session of
// another test in the same database may hold a snapshot that holds the
// cursor back for a moment.
func sweepPast(t *testing.T, store *Store, id int64) unfinishedWindow {
	t.Helper()
	var w unfinishedWindow
	require.Eventually(t, func() bool {
		var err error
		w, err = store.unfinished(context.Background())
		require.NoError(t, err)
		return w.swept >= id
	}, 30*time.Second, time.Millisecond, "the sweep's cursor does not reach %d", id)
	return w
}

// The sweep lists the keys still unfinished as its cursor passes them, and
// forgets them once they finish; the operations find unfinished keys below
// the cursor only through that list.
func TestSweepListsTheKeysStillUnfinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := plainStore(t, nil)
	// No lag, and chunks of two keys: the sweep lists four keys in two.
	store.sweepLag, store.sweepChunk = 0, 2
	now := time.Now()
	acquire := func(key string) idemdriver.LockRef {
		res, err := store.Acquire(ctx, sweepParams(key, &now))
		require.NoError(t, err)
		require.Equal(t, idemdriver.AcquiredCreated, res.Acquired, key)
		return idemdriver.LockRef{ID: res.Record.ID, Fence: res.Record.Fence, Scope: "s"}
	}
	stragglers := func() []int64 {
		var ids []int64
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(key_id ORDER BY key_id), '{}') FROM idem_stragglers`).Scan(&ids))
		return ids
	}

	done := acquire("done")
	commit(t, store, done, "", &now)
	idle := acquire("idle")
	require.NoError(t, store.Release(ctx, idle, "gave up"))
	parked := acquire("parked")
	require.NoError(t, store.SetNeedsReconcile(ctx, parked, "in doubt"))
	later := acquire("later") // finishes after the sweep passed it

	w := sweepPast(t, store, later.ID)
	require.Equal(t, later.ID, w.swept, "the cursor stops at the newest key it saw")
	require.Equal(t, []int64{idle.ID, parked.ID, later.ID}, stragglers(), "the unfinished keys, not the finished one")
	require.ElementsMatch(t, []int64{idle.ID, parked.ID, later.ID}, w.stragglers)
	unfinishedKeysFound(t, store, now, now.Add(time.Hour), 2, 1)

	// A straggler that finishes is forgotten by the next sweep; one the
	// reaper deletes goes with its key.
	commit(t, store, later, "", &now)
	soon := now.Add(time.Hour)
	reaped, err := store.ReapUnfinished(ctx, idemdriver.ReapUnfinishedParams{After: time.Minute, Limit: 10, Now: &soon})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.Deleted, "idle")
	next := acquire("next")
	sweepPast(t, store, next.ID)
	require.Equal(t, []int64{parked.ID, next.ID}, stragglers())
}

// unfinishedKeysFound checks that every operation that looks for unfinished
// keys finds running idle keys and needsReconcile parked ones, when nothing
// else is unfinished: the backlog, the startup count, the listing and the
// completer's claim at claimAt (every first lease run out, every key idle).
func unfinishedKeysFound(t *testing.T, store *Store, now, claimAt time.Time, running, needsReconcile int) {
	t.Helper()
	ctx := context.Background()
	b, err := store.Backlog(ctx, idemdriver.BacklogParams{Now: &now})
	require.NoError(t, err)
	require.EqualValues(t, running, b.Statuses[0].Keys, "backlog: running")
	require.EqualValues(t, needsReconcile, b.Statuses[1].Keys, "backlog: needs_reconcile")
	groups, err := store.UnfinishedKeys(ctx, []string{"f"})
	require.NoError(t, err)
	n := 0
	for _, g := range groups {
		n += g.Keys
	}
	require.Equal(t, running+needsReconcile, n, "startup count")
	list, err := store.ListKeys(ctx, idemdriver.ListKeysParams{KeyQuery: idemtype.KeyQuery{State: idemtype.KeyStateNeedsReconcile, Limit: 100}, Now: &now})
	require.NoError(t, err)
	require.Len(t, list.Keys, needsReconcile, "listing")
	claimed, err := store.ClaimIdle(ctx, idemdriver.ClaimIdleParams{Status: idemtype.StoredRunning, Flows: []string{"f"},
		IdleFor: time.Minute, Limit: 100, Now: &claimAt})
	require.NoError(t, err)
	require.Len(t, claimed, running, "completer")
}

// A key whose insert waited for a lock (the reaper's uncommitted delete of
// the expired key it replaces) takes its id before it waits and commits
// after: the sweep's cursor does not pass it while it waits, however long,
// so the operations find it once it lands.
func TestSweepWaitsForAnInsertThatWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, pid := storeOnOneConnection(t, schema, nil)
	control, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(control.Close)
	control.sweepLag = 0
	old, err := control.Acquire(ctx, sweepParams("k", nil))
	require.NoError(t, err)
	commit(t, control, idemdriver.LockRef{ID: old.Record.ID, Fence: old.Record.Fence, Scope: "s"}, "", nil)

	deleter, err := schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = deleter.Rollback(ctx) }()
	_, err = deleter.Exec(ctx, `DELETE FROM idem_keys WHERE id = $1`, old.Record.ID)
	require.NoError(t, err)
	landed := acquireBlocked(t, schema, store, pid, sweepParams("k", nil), "the insert waits for the delete")

	other, err := control.Acquire(ctx, sweepParams("other", nil))
	require.NoError(t, err)
	for range 5 {
		w, err := control.unfinished(ctx)
		require.NoError(t, err)
		require.Less(t, w.swept, other.Record.ID, "the cursor waits while an insert that took an id before it waits")
	}
	require.NoError(t, deleter.Commit(ctx))
	res := <-landed
	require.Equal(t, idemdriver.AcquiredCreated, res.Acquired)
	require.Less(t, res.Record.ID, other.Record.ID, "the waiting insert had its id first")
	sweepPast(t, control, other.Record.ID)
	b, err := control.Backlog(ctx, idemdriver.BacklogParams{})
	require.NoError(t, err)
	require.EqualValues(t, 2, b.Statuses[0].Keys, "both keys found")
}

// On Citus each worker numbers the keys it inserts from a range of its own,
// so the operations find unfinished keys through the layout's partial
// index, not a cursor over ids: keys over many scopes, on every worker,
// created before and after the operations ran, are all found.
func TestCitusFindsUnfinishedKeysOnEveryWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := citusStore(t)
	now := time.Now()
	acquire := func(scope, key string) idemdriver.LockRef {
		p := sweepParams(key, &now)
		p.Scope = scope
		res, err := store.Acquire(ctx, p)
		require.NoError(t, err)
		require.Equal(t, idemdriver.AcquiredCreated, res.Acquired, key)
		return idemdriver.LockRef{ID: res.Record.ID, Fence: res.Record.Fence, Scope: scope}
	}
	for i := range 8 {
		require.NoError(t, store.Release(ctx, acquire(fmt.Sprintf("scope%d", i), "a"), "gave up"))
	}
	unfinishedKeysFound(t, store, now, now.Add(time.Hour), 8, 0)
	for i := range 8 {
		require.NoError(t, store.Release(ctx, acquire(fmt.Sprintf("scope%d", i), "b"), "gave up"))
	}
	parked := acquire("scope0", "c")
	require.NoError(t, store.SetNeedsReconcile(ctx, parked, "in doubt"))
	unfinishedKeysFound(t, store, now, now.Add(2*time.Hour), 16, 1)
}

// The operations read the unfinished window, never the finished keys below
// the sweep's cursor, and the reaper reads the keys whose reap_after has
// passed, never those still in their retention: the statements run in a
// transaction whose own counters of the rows they read say how many.
func TestOperationsReadNoFinishedKeyOutsideTheirWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := plainStore(t, nil)
	store.sweepLag = 0
	const finished = 3000
	_, err := schema.Pool.Exec(ctx, `
		INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, status, recovery_point,
			response_status, finished_at, expires_at, reap_after, locked_at, lease_expires_at)
		SELECT 's', 'f' || i, 'f', 'POST', '/', '\x01', '{}', 'finished', 'finished', 201,
			now(), now() + interval '1 day', now() + interval '1 day', now(), now()
		FROM generate_series(1, $1) i`, finished)
	require.NoError(t, err)
	w := sweepPast(t, store, finished)
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

// The sweep moves its cursor at most once per lag: after one move, the
// keys created since are found past the cursor, however many sweeps are
// asked for. (The test's lag is an hour, so that a slow machine's calls,
// however far apart, all fall within it.)
func TestSweepWaitsItsLag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := plainStore(t, nil)
	require.Equal(t, sweepLag, store.sweepLag)
	store.sweepLag = time.Hour
	res, err := store.Acquire(ctx, sweepParams("k", nil))
	require.NoError(t, err)
	for range 3 {
		w, err := store.unfinished(ctx)
		require.NoError(t, err)
		require.Less(t, w.swept, res.Record.ID, "the cursor stays before the new key")
	}
	var listed int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_stragglers`).Scan(&listed))
	require.Zero(t, listed)
	b, err := store.Backlog(ctx, idemdriver.BacklogParams{})
	require.NoError(t, err)
	require.EqualValues(t, 1, b.Statuses[0].Keys, "found past the cursor")
}
