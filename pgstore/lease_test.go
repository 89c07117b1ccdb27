package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

// A takeover decides on the lease row's newest version, not on what its
// acquisition statement read: a heartbeat or a foreign mark in flight when a
// takeover comes is waited for, and then counts. (Before idem_leases, both
// wrote the key's one row, which the takeover's UPDATE re-checked the same
// way; now the takeover locks the lease row for it.)
func TestTakeoverWaitsForTheLeaseRowInFlight(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		inFlight  string // what the other transaction writes on the lease row
		wantTaken bool
		wantMark  string
	}{
		"a heartbeat renews the lease": {`UPDATE idem_leases SET lease_expires_at = $2::timestamptz + interval '1 hour' WHERE key_id = $1`, false, ""},
		"a mark is made":               {`UPDATE idem_leases SET foreign_mark = 'call', foreign_mark_after = 'started' WHERE key_id = $1 AND $2::timestamptz IS NOT NULL`, true, "call"},
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

			// The other transaction holds the lease row, uncommitted, while a
			// retry two minutes later finds the lease expired in its snapshot.
			other, err := schema.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = other.Rollback(ctx) }()
			_, err = other.Exec(ctx, tc.inFlight, acq.Record.ID, t0)
			require.NoError(t, err)
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
	leaseScans := func(key string) (acquired idemdriver.Acquisition, scans int64) {
		tx, err := schema.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		const counters = `SELECT pg_stat_get_xact_numscans('idem_leases'::regclass) + pg_stat_get_xact_numscans('idem_leases_pkey'::regclass)`
		var before, after int64
		require.NoError(t, tx.QueryRow(ctx, counters).Scan(&before))
		require.NoError(t, tx.QueryRow(ctx, `SELECT acquired FROM (`+store.q.acquire+`) a`,
			append([]any{nil, "s", key, "f", "POST", "/", []byte{1}, "{}", int64(90e6), false, ""}, store.holder.args()...)...).Scan(&acquired))
		require.NoError(t, tx.QueryRow(ctx, counters).Scan(&after))
		return acquired, after - before
	}
	acquired, scans := leaseScans("finished")
	require.Equal(t, idemdriver.AcquiredNone, acquired)
	require.Zero(t, scans, "a replay does not read the lease row")
	acquired, scans = leaseScans("running")
	require.Equal(t, idemdriver.AcquiredNone, acquired)
	require.Equal(t, int64(1), scans, "an in-progress answer reads it by its primary key")
}
