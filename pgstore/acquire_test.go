package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

// The acquisition function returns (acquired, db_now) and then exactly the
// columns recordColumns renders, with the same names and types in the same
// order, so recordDest scans both. The function is written out in its
// migration, which never changes once released: when this fails after a
// change to recordColumns, replace the function in a new migration.
func TestAcquireFunctionMatchesRecordColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	conn, err := schema.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	describe := func(sql string) []string {
		desc, err := conn.Conn().Prepare(ctx, "", sql)
		require.NoError(t, err, sql)
		var cols []string
		for _, f := range desc.Fields {
			cols = append(cols, fmt.Sprintf("%s %d", f.Name, f.DataTypeOID))
		}
		return cols
	}
	want := describe(`SELECT 'created'::text AS acquired, now() AS db_now, ` + recordColumns("k", "l") + `
		FROM ` + store.q.table + ` k LEFT JOIN ` + store.q.leases + ` l ON l.key_id = k.id`)
	require.Len(t, want, 2+len(recordDest(&idemtype.KeyRecord{})))
	require.Equal(t, want, describe(store.q.acquire))
}

// The acquisition reports a key exactly as GetKey reads it, in every state
// (a finished key without its params and checkpoint), and a key it creates
// as GetKey then reads it.
func TestAcquisitionReadsKeysAsGetKeyDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	_, err = schema.Pool.Exec(ctx, `
		WITH k AS (
			INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params,
				status, recovery_point, checkpoint, fence, response_status, response_headers, response_body,
				attempts, last_error, finished_at, expires_at)
			VALUES
			-- every column set, a mark in doubt
			('s', 'reconcile', 'f', 'PATCH', '/p', '\x0102', '{"a": 1}', 'needs_reconcile', 'first', '{"c": 2}',
				7, 402, '{"X": ["y"]}', '\x7b7d', 3, 'boom', now(), now() + interval '1 day'),
			-- held, its mark retired by a later commit
			('s', 'held', 'f', 'POST', '/', '\x01', '{}', 'running', 'second', '{"c": 3}',
				2, NULL, NULL, NULL, 2, NULL, NULL, NULL),
			-- released
			('s', 'released', 'f', 'POST', '/', '\x01', '{}', 'running', 'started', '{}',
				1, NULL, NULL, NULL, 1, 'failed', NULL, NULL),
			-- finished, its lease row left as the holder left it
			('s', 'finished', 'f', 'POST', '/', '\x01', '{"b": 2}', 'finished', 'finished', '{"c": 4}',
				1, 201, '{"Content-Type": ["application/json"]}', '\x7b7d', 1, NULL, now(), now() + interval '1 day')
			RETURNING scope, id, key, fence
		)
		INSERT INTO idem_leases (scope, key_id, fence, locked_at, lease_expires_at, foreign_mark, foreign_mark_after)
		SELECT scope, id, fence,
			CASE WHEN key <> 'released' THEN now() - interval '1 minute' END,
			CASE WHEN key <> 'released' THEN now() + interval '1 minute' END,
			CASE WHEN key <> 'released' THEN 'call' END,
			CASE key WHEN 'reconcile' THEN 'first' WHEN 'held' THEN 'first' WHEN 'finished' THEN 'finished' END
		FROM k;
		-- a key without a lease row
		INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params)
		VALUES ('s', 'no-lease', 'f', 'POST', '/', '\x01', '{}');`)
	require.NoError(t, err)

	for _, key := range []string{"reconcile", "held", "released", "finished", "no-lease"} {
		want, err := store.GetKey(ctx, "s", key)
		require.NoError(t, err, key)
		if want.Status == idemtype.StoredFinished {
			want.Params, want.Checkpoint = nil, nil
		}
		for _, noCreate := range []bool{false, true} {
			// Another fingerprint: the acquisition reports the key and takes
			// nothing over.
			res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: key, Flow: "f", Method: "POST", Path: "/",
				Fingerprints: [][]byte{[]byte{9}}, Params: []byte(`{}`), Lease: time.Minute, NoCreate: noCreate})
			require.NoError(t, err, key)
			require.Equal(t, idemdriver.AcquiredNone, res.Acquired, key)
			require.Equal(t, want, res.Record, key)
		}
	}
	rec, err := store.GetKey(ctx, "s", "reconcile")
	require.NoError(t, err)
	require.Equal(t, "call", rec.ForeignMark, "the states above are what they say")
	rec, err = store.GetKey(ctx, "s", "finished")
	require.NoError(t, err)
	require.Nil(t, rec.LockedAt)
	require.JSONEq(t, `{"b": 2}`, string(rec.Params), "GetKey reads a finished key's params")

	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: "new", Flow: "f", Method: "POST", Path: "/",
		Fingerprints: [][]byte{[]byte{9}}, Params: []byte(`{"n": 1}`), Lease: time.Minute, Now: &t0})
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredCreated, res.Acquired)
	require.Equal(t, t0, res.DBNow.UTC())
	require.Equal(t, t0.Add(time.Minute), res.Record.LeaseExpiresAt.UTC())
	want, err := store.GetKey(ctx, "s", "new")
	require.NoError(t, err)
	require.Equal(t, want, res.Record)
}

// A finished key's params are not decoded for its replay: one whose params
// are sealed with a key the keyring no longer holds still replays (GetKey,
// which returns them, cannot open it).
func TestReplayDoesNotOpenTheParams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	// The response is written in the clear: accepted, to keep this test
	// about the params.
	store, err := New(schema.Pool, &Config{Schema: schema.Name, Keyring: &idemtype.Keyring{
		Current: "new", Keys: map[string][]byte{"new": make([]byte, 32)}, AcceptUnkeyed: true,
	}})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	_, err = schema.Pool.Exec(ctx, `
		INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, params_key_id,
			status, recovery_point, response_status, response_headers, response_body, finished_at, expires_at)
		VALUES ('s', 'k', 'f', 'POST', '/', '\x01', '"c2VhbGVk"', 'old',
			'finished', 'finished', 201, '{}', 'done', now(), now() + interval '1 day')`)
	require.NoError(t, err)

	res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: "k", Flow: "f", Method: "POST", Path: "/",
		Fingerprints: [][]byte{[]byte{1}}, Params: []byte(`{}`), Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredNone, res.Acquired)
	require.Equal(t, "done", string(res.Record.Response().Body))
	require.Nil(t, res.Record.Params)
	require.Equal(t, "old", res.Record.ParamsKeyID)

	_, err = store.GetKey(ctx, "s", "k")
	require.ErrorIs(t, err, ErrCannotOpen)
}

// An acquirer whose insert meets a concurrent insert of the same key (one
// committed after its statement's snapshot) reports the other's key as it
// stands, in a second call. Under read committed the insert waits for the
// other transaction and does nothing, and the statement's snapshot cannot
// see what it met; under a server default of repeatable read the insert is
// a serialization failure. Either way idem_acquire then reads the key, and
// nothing fails and nothing is inserted twice.
func TestAcquireMeetsAConcurrentInsert(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"read committed", "repeatable read"} {
		t.Run(isolation, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			schema := pgtest.NewMigratedSchema(t)
			store, pid := storeOnOneConnection(t, schema, map[string]string{"default_transaction_isolation": isolation})

			// The other acquirer's insert, not yet committed.
			other, err := schema.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = other.Rollback(ctx) }()
			var otherID int64
			require.NoError(t, other.QueryRow(ctx, `
				WITH k AS (
					INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params)
					VALUES ('s', 'k', 'f', 'POST', '/', '\x01', '{}') RETURNING scope, id, fence
				)
				INSERT INTO idem_leases (scope, key_id, fence, locked_at, lease_expires_at)
				SELECT scope, id, fence, now(), now() + interval '1 hour' FROM k RETURNING key_id`).Scan(&otherID))

			done := acquireBlocked(t, schema, store, pid, idemdriver.AcquireParams{Scope: "s", Key: "k", Flow: "f", Method: "POST", Path: "/",
				Fingerprints: [][]byte{[]byte{1}}, Params: []byte(`{}`), Lease: time.Minute}, "the insert waits for the other transaction")
			require.NoError(t, other.Commit(ctx))

			res := <-done
			require.NotNil(t, res)
			require.Equal(t, idemdriver.AcquiredNone, res.Acquired)
			require.Equal(t, otherID, res.Record.ID)
			require.True(t, res.Record.Locked(res.DBNow), "the other holds it")
			require.Equal(t, 1, res.Retried, "a second call, after the insert met the other's key (read committed: outside its snapshot; repeatable read: a serialization failure)")
			var keys int
			require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys`).Scan(&keys))
			require.Equal(t, 1, keys)
		})
	}
}

// NoCreate reports nothing for an absent or expired key and leaves the
// expired key where it is; an acquisition that may create replaces it.
func TestNoCreateLeavesAnExpiredKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	var expiredID int64
	require.NoError(t, schema.Pool.QueryRow(ctx, `
		INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params,
			status, recovery_point, response_status, finished_at, expires_at)
		VALUES ('s', 'expired', 'f', 'POST', '/', '\x01', '{}', 'finished', 'finished', 201, now() - interval '2 days', now() - interval '1 day')
		RETURNING id`).Scan(&expiredID))
	p := idemdriver.AcquireParams{Scope: "s", Flow: "f", Method: "POST", Path: "/", Fingerprints: [][]byte{[]byte{1}}, Params: []byte(`{}`), Lease: time.Minute}

	for _, key := range []string{"absent", "expired"} {
		p.Key, p.NoCreate = key, true
		res, err := store.Acquire(ctx, p)
		require.NoError(t, err, key)
		require.Equal(t, idemdriver.AcquiredNone, res.Acquired, key)
		require.Nil(t, res.Record, key)
	}
	var keys int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys WHERE id = $1`, expiredID).Scan(&keys))
	require.Equal(t, 1, keys, "NoCreate leaves the expired key")

	p.NoCreate = false
	res, err := store.Acquire(ctx, p)
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredCreated, res.Acquired)
	require.NotEqual(t, expiredID, res.Record.ID)
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys`).Scan(&keys))
	require.Equal(t, 1, keys, "the new key replaced the expired one")
}
