package pgstore

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
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
			Fingerprints: [][]byte{[]byte{1}}, Params: []byte("{}"), Lease: time.Hour})
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
	_, err = dead.Heartbeat(ctx, idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence, Scope: rec.Scope}, time.Hour, nil)
	require.ErrorIs(t, err, idemtype.ErrLockLost, "the fence moved: the old process can write nothing")
	require.Equal(t, idemdriver.AcquiredNone, acquire(restarted).Acquired, "its own live lease is not taken again")
	t.Logf("restarted instance took the key over at fence %d; holder %s host %s pid %d boot %s",
		res.Record.Fence, res.Record.HolderInstance, res.Record.HolderHost, res.Record.HolderPID, res.Record.HolderBoot)
}
