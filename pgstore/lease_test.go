package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

// A takeover decides on the lease row's newest version, not on what its
// acquisition statement read: a heartbeat or a foreign mark in flight when a
// takeover comes is waited for, and then counts. A new key has no lease row
// (its row carries its first lease), so the heartbeat or mark in flight is
// the one that makes the lease row: the takeover's insert of the same row
// waits for it, and then meets it as a conflict on its newest version.
func TestTakeoverWaitsForTheLeaseRowInFlight(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		inFlight  func(q *queries, rec *idemtype.KeyRecord, t0 time.Time) (string, []any)
		wantTaken bool
		wantMark  string
	}{
		"a heartbeat renews the lease": {func(q *queries, rec *idemtype.KeyRecord, t0 time.Time) (string, []any) {
			renewedAt := t0.Add(time.Minute)
			return q.heartbeat, []any{rec.ID, rec.Fence, (90 * time.Second).Microseconds(), renewedAt, rec.Scope}
		}, false, ""},
		"a mark is made": {func(q *queries, rec *idemtype.KeyRecord, t0 time.Time) (string, []any) {
			return q.markForeign, []any{rec.ID, rec.Fence, "call", rec.Scope}
		}, true, "call"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			schema := pgtest.NewMigratedSchema(t)
			store, pid := storeOnOneConnection(t, schema, nil)

			t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			p := idemdriver.AcquireParams{Scope: "s", Key: "k", Flow: "f", Method: "POST", Path: "/", Fingerprints: [][]byte{[]byte{1}},
				Params: []byte(`{}`), Lease: 90 * time.Second, Now: &t0}
			acq, err := store.Acquire(ctx, p)
			require.NoError(t, err)
			require.Equal(t, idemdriver.AcquiredCreated, acq.Acquired)

			// The other transaction makes the lease row, uncommitted, while a
			// retry two minutes later finds the first lease expired in its
			// snapshot.
			other, err := schema.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = other.Rollback(ctx) }()
			sql, args := tc.inFlight(store.q, acq.Record, t0)
			tag, err := other.Exec(ctx, sql, args...)
			require.NoError(t, err)
			require.Equal(t, int64(1), tag.RowsAffected(), "the statement in flight made the lease row")
			later := t0.Add(2 * time.Minute)
			p.Now = &later
			done := acquireBlocked(t, schema, store, pid, p, "the takeover waits for the lease row")
			require.NoError(t, other.Commit(ctx))

			res := <-done
			require.NotNil(t, res)
			rec, err := store.GetKey(ctx, "s", "k")
			require.NoError(t, err)
			if tc.wantTaken {
				require.Equal(t, idemdriver.AcquiredTakenOver, res.Acquired)
				require.Equal(t, tc.wantMark, res.Record.ForeignMark, "the takeover sees the mark it waited for")
				require.Equal(t, int64(2), rec.Fence)
			} else {
				require.Equal(t, idemdriver.AcquiredNone, res.Acquired, "the renewed lease holds")
				require.Equal(t, int64(1), rec.Fence)
			}
		})
	}
}

// Every statement that moves the fence moves it on both rows, and the
// statements guarded on the lease row (heartbeats, marks) stop matching.
func TestFenceMovesOnBothRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := idemdriver.AcquireParams{Scope: "s", Key: "k", Flow: "f", Method: "POST", Path: "/", Fingerprints: [][]byte{[]byte{1}},
		Params: []byte(`{}`), Lease: 90 * time.Second, Now: &t0}
	acq, err := store.Acquire(ctx, p)
	require.NoError(t, err)
	ref := idemdriver.LockRef{ID: acq.Record.ID, Fence: 1, Scope: "s"}
	fences := func() (key, lease int64) {
		require.NoError(t, schema.Pool.QueryRow(ctx,
			`SELECT k.fence, l.fence FROM idem_keys k JOIN idem_leases l ON l.scope = k.scope AND l.key_id = k.id WHERE k.id = $1`, ref.ID).Scan(&key, &lease))
		return key, lease
	}

	unlocked, err := store.UnlockKey(ctx, idemdriver.UnlockParams{Scope: "s", Key: "k", Reason: "operator"})
	require.NoError(t, err)
	require.True(t, unlocked.Unlocked)
	require.Nil(t, unlocked.Record.LockedAt)
	k, l := fences()
	require.Equal(t, [2]int64{2, 2}, [2]int64{k, l})
	_, err = store.Heartbeat(ctx, ref, time.Minute, &t0)
	require.ErrorIs(t, err, idemtype.ErrLockLost)
	require.ErrorIs(t, store.MarkForeign(ctx, ref, "call"), idemtype.ErrLockLost)
	require.ErrorIs(t, store.Release(ctx, ref, "x"), idemtype.ErrLockLost)

	taken, err := store.Acquire(ctx, p) // unlocked: taken over
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredTakenOver, taken.Acquired)
	k, l = fences()
	require.Equal(t, [2]int64{3, 3}, [2]int64{k, l})
	ref.Fence = 3
	require.NoError(t, store.MarkForeign(ctx, ref, "call"))
	require.NoError(t, store.SetNeedsReconcile(ctx, ref, "in doubt"))
	rec, err := store.GetKey(ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, "call", rec.ForeignMark)
	require.Nil(t, rec.LockedAt)

	claimed, err := store.ClaimReconcile(ctx, idemdriver.ClaimParams{Scope: "s", Key: "k", Lease: time.Minute, Now: &t0})
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredTakenOver, claimed.Acquired)
	require.Equal(t, "call", claimed.Record.ForeignMark)
	k, l = fences()
	require.Equal(t, [2]int64{4, 4}, [2]int64{k, l})
	require.ErrorIs(t, store.ClearForeignMark(ctx, ref), idemtype.ErrLockLost, "the old fence clears nothing")
	ref.Fence = 4
	require.NoError(t, store.ClearForeignMark(ctx, ref))
	rec, err = store.GetKey(ctx, "s", "k")
	require.NoError(t, err)
	require.Empty(t, rec.ForeignMark)
	require.NotNil(t, rec.LockedAt)
}

// A replay does not read the lease row of the finished key it replays (it
// means nothing once the key finished): the acquisition scans neither
// idem_leases nor its index for it, as the transaction's own statistics
// counters show (they count scans until the transaction ends).
func TestReplayDoesNotReadTheLeaseRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	_, err = schema.Pool.Exec(ctx, `
		WITH k AS (
			INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, status, recovery_point, response_status, expires_at)
			VALUES ('s', 'finished', 'f', 'POST', '/', '\x01', '{}', 'finished', 'finished', 201, now() + interval '1 day'),
			       ('s', 'running', 'f', 'POST', '/', '\x01', '{}', 'running', 'started', NULL, NULL)
			RETURNING scope, id, fence
		)
		INSERT INTO idem_leases (scope, key_id, fence, locked_at, lease_expires_at) SELECT scope, id, fence, now(), now() + interval '1 minute' FROM k`)
	require.NoError(t, err)
	holder := store.holder.args()
	// Each acquisition statement with its arguments for key: idem_acquire,
	// and the plain-SQL statements sent before it.
	statements := map[string]func(key string) (string, []any){
		"idem_acquire": func(key string) (string, []any) {
			return store.q.acquire, append(append([]any{nil, "s", key, "f", "POST", "/", []byte{1}, "{}", int64(90e6), false, ""}, holder...), int64(0))
		},
		"insertOrReport": func(key string) (string, []any) {
			return store.q.insertOrReport, append(append([]any{nil, "s", key, "f", "POST", "/", []byte{1}, "{}", int64(90e6), ""}, holder...), int64(0))
		},
		"lookUp": func(key string) (string, []any) { return store.q.lookUp, []any{nil, "s", key} },
	}
	for name, statement := range statements {
		leaseScans := func(key string) (acquired idemdriver.Acquisition, scans int64) {
			tx, err := schema.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			const counters = `SELECT pg_stat_get_xact_numscans('idem_leases'::regclass) + pg_stat_get_xact_numscans('idem_leases_pkey'::regclass)`
			var before, after int64
			require.NoError(t, tx.QueryRow(ctx, counters).Scan(&before))
			sql, args := statement(key)
			res, err := store.acquisition(ctx, tx, sql, args...)
			require.NoError(t, err)
			acquired = res.Acquired
			require.NoError(t, tx.QueryRow(ctx, counters).Scan(&after))
			return acquired, after - before
		}
		acquired, scans := leaseScans("finished")
		require.Equal(t, idemdriver.AcquiredNone, acquired, name)
		require.Zero(t, scans, "%s: a replay does not read the lease row", name)
		acquired, scans = leaseScans("running")
		require.Equal(t, idemdriver.AcquiredNone, acquired, name)
		require.Equal(t, int64(1), scans, "%s: an in-progress answer reads it by its primary key", name)
	}
}

// A new key has no lease row: the first lease on its row is its lease
// until something writes the lease. Every reader of the lease must read it
// there, or a live key reads as free and runs twice. Each reader is checked
// on a held key without a lease row (it must see it held), then once the
// first lease has run out (it must see it free), on plain PostgreSQL and
// on Citus, whose maintenance statements are the key-by-key variants.
func TestEveryLeaseReaderReadsTheFirstLease(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]func(t *testing.T) (*Store, *pgtest.Schema){
		"plain": func(t *testing.T) (*Store, *pgtest.Schema) {
			schema := pgtest.NewMigratedSchema(t)
			store, err := New(schema.Pool, &Config{Schema: schema.Name, Instance: "web-1"})
			require.NoError(t, err)
			t.Cleanup(store.Close)
			return store, schema
		},
		"citus": func(t *testing.T) (*Store, *pgtest.Schema) {
			st, schema := citusStore(t)
			store, err := New(schema.Pool, &Config{Schema: schema.Name, Instance: "web-1"})
			require.NoError(t, err)
			t.Cleanup(store.Close)
			require.True(t, st.Distributed())
			return store, schema
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			holder, schema := setup(t)
			other, err := New(schema.Pool, &Config{Schema: schema.Name, Instance: "web-2"})
			require.NoError(t, err)
			t.Cleanup(other.Close)
			fp := [][]byte{append([]byte{2}, make([]byte, 32)...)}
			params := func(key string, now *time.Time) idemdriver.AcquireParams {
				return idemdriver.AcquireParams{Scope: "s", Key: key, Flow: "f", Method: "POST", Path: "/",
					Fingerprints: fp, Params: []byte(`{}`), Lease: time.Hour, Now: now}
			}
			leaseRows := func() int {
				var n int
				require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM `+holder.q.leases).Scan(&n))
				return n
			}
			acq, err := holder.Acquire(ctx, params("held", nil))
			require.NoError(t, err)
			require.Equal(t, idemdriver.AcquiredCreated, acq.Acquired)
			require.Zero(t, leaseRows(), "a new key has no lease row")
			ref := idemdriver.LockRef{ID: acq.Record.ID, Fence: acq.Record.Fence, Scope: acq.Record.Scope}

			// Held: every reader sees the first lease.
			rec, err := other.GetKey(ctx, "s", "held")
			require.NoError(t, err)
			require.NotNil(t, rec.LockedAt)
			require.Equal(t, "web-1", rec.HolderInstance)
			res, err := other.Acquire(ctx, params("held", nil))
			require.NoError(t, err)
			require.Equal(t, idemdriver.AcquiredNone, res.Acquired, "not taken over")
			require.True(t, res.Record.Locked(res.DBNow))
			// The takeover statement itself, as a race past Acquire's own
			// check would send it, finds the key held.
			_, err = other.acquisition(ctx, other.db, other.q.takeOver, append(append([]any{
				nil, acq.Record.ID, "f", acq.Record.Fingerprint, time.Hour.Microseconds(), "POST", "/"}, other.holder.args()...), "s")...)
			require.ErrorIs(t, err, pgx.ErrNoRows, "the takeover statement finds the first lease held")
			claimed, err := other.ClaimIdle(ctx, idemdriver.ClaimIdleParams{Status: idemtype.StoredRunning, Flows: []string{"f"}, IdleFor: time.Microsecond, Limit: 10})
			require.NoError(t, err)
			require.Empty(t, claimed, "not claimed by the completer")
			reaped, err := other.ReapUnfinished(ctx, idemdriver.ReapUnfinishedParams{After: time.Microsecond, Limit: 10})
			require.NoError(t, err)
			require.Zero(t, reaped.Deleted+reaped.NeedsReconcile, "not reaped")
			over, left, err := other.markWaited(ctx, ref)
			require.NoError(t, err)
			require.False(t, over, "a waiter waits")
			require.Greater(t, left, 50*time.Minute)
			for state, want := range map[idemtype.KeyState]int{idemtype.KeyStateRunning: 1, idemtype.KeyStateStale: 0} {
				list, err := other.ListKeys(ctx, idemdriver.ListKeysParams{KeyQuery: idemtype.KeyQuery{State: state, AllScopes: true, Limit: 10}})
				require.NoError(t, err)
				require.Len(t, list.Keys, want, state)
			}
			// A restarted process of the holder's instance takes its keys
			// over at once, as it does a lease row's.
			restarted, err := New(schema.Pool, &Config{Schema: schema.Name, Instance: "web-1"})
			require.NoError(t, err)
			t.Cleanup(restarted.Close)
			restarted.holder.boot = "an earlier boot"
			res, err = restarted.Acquire(ctx, params("held", nil))
			require.NoError(t, err)
			require.Equal(t, idemdriver.AcquiredTakenOver, res.Acquired, "the holder's instance restarted")

			// Run out: every reader sees it free.
			for _, key := range []string{"taken", "claimed", "abandoned"} {
				acq, err := holder.Acquire(ctx, params(key, nil))
				require.NoError(t, err)
				require.Equal(t, idemdriver.AcquiredCreated, acq.Acquired)
			}
			later := time.Now().Add(2 * time.Hour)
			res, err = other.Acquire(ctx, params("taken", &later))
			require.NoError(t, err)
			require.Equal(t, idemdriver.AcquiredTakenOver, res.Acquired)
			claimed, err = other.ClaimIdle(ctx, idemdriver.ClaimIdleParams{Status: idemtype.StoredRunning, Flows: []string{"f"}, IdleFor: time.Minute, Limit: 10, Now: &later})
			require.NoError(t, err)
			var keys []string
			for _, c := range claimed {
				keys = append(keys, c.Key)
			}
			// held's lease (the restarted process's, on its lease row) has run
			// out too; taken's has just been taken.
			require.ElementsMatch(t, []string{"held", "claimed", "abandoned"}, keys, "the completer claims the keys nobody holds")
			reaped, err = other.ReapUnfinished(ctx, idemdriver.ReapUnfinishedParams{After: time.Hour, Limit: 10, Now: &later})
			require.NoError(t, err)
			require.Equal(t, 3, reaped.Deleted, "the keys nobody holds are reaped, not the one just taken")
		})
	}
}
