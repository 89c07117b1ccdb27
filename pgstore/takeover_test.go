package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
)

// An unfinished key nobody holds is taken over only by a request of the
// same flow, fingerprint, method and path: the key is bound to all four.
func TestTakeOverNeedsTheSameMethodAndPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	_, err = schema.Pool.Exec(ctx, `INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, recovery_point)
		VALUES ('s', 'k', 'f', 'POST', '/a', '\x01', '{}', 'one')`)
	require.NoError(t, err)
	acquire := func(method, path string) *idemdriver.AcquireResult {
		t.Helper()
		res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: "k", Flow: "f", Method: method, Path: path,
			Fingerprints: [][]byte{[]byte{1}}, Params: []byte("{}"), Lease: time.Minute})
		require.NoError(t, err)
		return res
	}

	for _, other := range [][2]string{{"PATCH", "/a"}, {"POST", "/b"}} {
		res := acquire(other[0], other[1])
		require.Equal(t, idemdriver.AcquiredNone, res.Acquired, "%s %s", other[0], other[1])
		require.Nil(t, res.Record.LockedAt)
		require.Equal(t, int64(1), res.Record.Fence)

		// The statement itself refuses, should the check before it be skipped.
		_, err := store.acquisition(ctx, store.db, store.q.takeOver, append(append([]any{nil, res.Record.ID, "f", []byte{1}, time.Minute.Microseconds(), other[0], other[1]},
			store.holder.args()...), "s")...)
		require.ErrorIs(t, err, pgx.ErrNoRows)
	}
	res := acquire("POST", "/a")
	require.Equal(t, idemdriver.AcquiredTakenOver, res.Acquired)
	require.Equal(t, int64(2), res.Record.Fence)
}
