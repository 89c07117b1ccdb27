package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
)

// storeOnOneConnection returns a store whose statements all run on one
// connection, and that connection's backend pid, so a test can see when the
// store's statement waits for a lock. Its control statements use the
// schema's pool. runtimeParams are set on the connection.
func storeOnOneConnection(t *testing.T, schema *pgtest.Schema, runtimeParams map[string]string) (*Store, int) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(schema.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	for name, value := range runtimeParams {
		cfg.ConnConfig.RuntimeParams[name] = value
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := New(pool, &Config{Schema: schema.Name, ControlDB: schema.Pool})
	require.NoError(t, err)
	var pid int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	return store, pid
}

// acquireBlocked starts store.Acquire(p) and returns once the backend pid
// waits for a lock (what a test's other transaction holds); the result
// arrives on the channel when that transaction ends. why says what the wait
// is for, in a failure message.
func acquireBlocked(t *testing.T, schema *pgtest.Schema, store *Store, pid int, p idemdriver.AcquireParams, why string) <-chan *idemdriver.AcquireResult {
	t.Helper()
	ctx := context.Background()
	done := make(chan *idemdriver.AcquireResult, 1)
	go func() {
		res, err := store.Acquire(ctx, p)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, schema.Pool.QueryRow(ctx,
			`SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting))
		return waiting
	}, 30*time.Second, 10*time.Millisecond, why)
	return done
}
