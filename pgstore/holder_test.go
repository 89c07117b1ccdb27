package pgstore

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
)

// A lease names its holder, and a process of the same instance with another
// boot (the instance restarted) takes a live lease over at once, moving the
// fence; another instance, a store without an instance and another store of
// the same process wait for the lease like everyone else.
func TestRestartedInstanceTakesOverItsLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	newStore := func(instance, boot string) *Store {
		store, err := New(schema.Pool, &Config{Schema: schema.Name, Instance: instance})
		require.NoError(t, err)
		t.Cleanup(store.Close)
		if boot != "" {
			store.holder.boot = boot
		}
		return store
	}
	acquire := func(store *Store) *idemdriver.AcquireResult {
		t.Helper()
		res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: "k", Flow: "f", Method: "POST", Path: "/",
			Fingerprint: []byte{1}, Params: []byte("{}"), Lease: time.Hour})
		require.NoError(t, err)
		return res
	}

	dead := newStore("web-1", "")
	first := acquire(dead)
	require.Equal(t, idemdriver.AcquiredCreated, first.Acquired)
	host, _ := os.Hostname()
	rec := first.Record
	require.Equal(t, []any{"web-1", host, os.Getpid(), bootID}, []any{rec.HolderInstance, rec.HolderHost, rec.HolderPID, rec.HolderBoot})
	got, err := dead.GetKey(ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, rec.HolderBoot, got.HolderBoot, "GetKey reads the holder as the acquisition returned it")

	for name, other := range map[string]*Store{
		"another instance":                  newStore("web-2", "another boot"),
		"no instance":                       newStore("", "another boot"),
		"another store of the same process": newStore("web-1", ""),
	} {
		res := acquire(other)
		require.Equal(t, idemdriver.AcquiredNone, res.Acquired, name)
		require.True(t, res.Record.Locked(res.DBNow), name)
		require.Equal(t, int64(1), res.Record.Fence, name)
	}

	restarted := newStore("web-1", "next boot")
	res := acquire(restarted)
	require.Equal(t, idemdriver.AcquiredTakenOver, res.Acquired, "a lease of this instance's earlier boot is taken at once")
	require.Equal(t, int64(2), res.Record.Fence)
	require.Equal(t, "next boot", res.Record.HolderBoot)
	require.Equal(t, "web-1", res.Record.HolderInstance)
	_, err = dead.Heartbeat(ctx, idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence}, time.Hour, nil)
	require.ErrorIs(t, err, idemdriver.ErrLockLost, "the fence moved: the old process can write nothing")
	require.Equal(t, idemdriver.AcquiredNone, acquire(restarted).Acquired, "its own live lease is not taken again")
	t.Logf("restarted instance took the key over at fence %d; holder %s host %s pid %d boot %s",
		res.Record.Fence, res.Record.HolderInstance, res.Record.HolderHost, res.Record.HolderPID, res.Record.HolderBoot)
}

// The previous version's binaries keep working on this schema: their
// acquisition function creates keys that name no holder, and a takeover
// written as they write it (the fence moved, the holder columns left as
// they were) leaves a lease no restarted instance mistakes for its own.
func TestLeasesOfThePreviousVersionNameNoHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := New(schema.Pool, &Config{Schema: schema.Name, Instance: "web-1"})
	require.NoError(t, err)
	t.Cleanup(store.Close)

	var acquired string
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT acquired FROM idem_acquire_v7(NULL, 's', 'old', 'f', 'POST', '/', '\x01', '{}', 3600000000, false, '')`).Scan(&acquired))
	require.Equal(t, "created", acquired)
	rec, err := store.GetKey(ctx, "s", "old")
	require.NoError(t, err)
	require.NotNil(t, rec.LockedAt)
	require.Empty(t, rec.HolderInstance+rec.HolderHost+rec.HolderBoot)
	require.Zero(t, rec.HolderPID)

	res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: "new", Flow: "f", Method: "POST", Path: "/",
		Fingerprint: []byte{1}, Params: []byte("{}"), Lease: time.Hour})
	require.NoError(t, err)
	require.Equal(t, "web-1", res.Record.HolderInstance)
	// The previous version's takeover of an expired lease: fence and lease
	// only.
	_, err = schema.Pool.Exec(ctx, `
		WITH k AS (UPDATE idem_keys SET fence = fence + 1 WHERE key = 'new' RETURNING id, fence)
		UPDATE idem_leases l SET fence = k.fence, locked_at = now(), lease_expires_at = now() + interval '1 hour'
		FROM k WHERE l.key_id = k.id`)
	require.NoError(t, err)
	rec, err = store.GetKey(ctx, "s", "new")
	require.NoError(t, err)
	require.Empty(t, rec.HolderInstance, "the holder recorded at the old fence no longer describes the lease")
	store.holder.boot = "next boot"
	res, err = store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: "new", Flow: "f", Method: "POST", Path: "/",
		Fingerprint: []byte{1}, Params: []byte("{}"), Lease: time.Hour})
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredNone, res.Acquired, "a lease the previous version took is waited for")
	// Even if the check before the statement were skipped, the statement
	// itself refuses.
	_, err = store.acquisition(ctx, store.db, store.q.takeOver, append([]any{nil, rec.ID, "f", []byte{1}, time.Hour.Microseconds(), "POST", "/"},
		store.holder.args()...)...)
	require.ErrorIs(t, err, pgx.ErrNoRows)
}
