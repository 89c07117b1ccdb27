package pgstore

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
)

func poolIn(t *testing.T, url string, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Behind PgBouncer 1.18 in transaction mode, the modes that need a
// statement to live beyond one transaction (cache_statement's named
// statements, describe_exec's unnamed one across two syncs) are refused at
// New, naming the modes that work; those modes are accepted. On a direct
// connection every mode is.
func TestStoreRefusesCachedStatementsBehindPgBouncer(t *testing.T) {
	t.Parallel()
	bounced := pgtest.NewBouncedSchema(t)
	for _, mode := range pgtest.QueryExecModes {
		direct, err := New(poolIn(t, bounced.URL, mode), &Config{Schema: bounced.Name})
		require.NoError(t, err, mode.String())
		direct.Close()

		store, err := New(poolIn(t, bounced.BouncedURL, mode), &Config{Schema: bounced.Name})
		switch mode {
		case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec:
			require.ErrorIs(t, err, ErrPoolerExecMode, mode.String())
			require.ErrorContains(t, err, "default_query_exec_mode=exec")
			require.ErrorContains(t, err, "cache_describe")
			t.Logf("%s: %v", mode, err)
		default:
			require.NoError(t, err, mode.String())
			store.Close()
		}
	}
	// A pooler that gives each client a server connection of its own for
	// its whole session is trusted with every mode when the config says so
	// (WaitListen on its own connections: they keep their session).
	store, err := New(poolIn(t, bounced.BouncedURL, pgx.QueryExecModeCacheStatement),
		&Config{Schema: bounced.Name, Wait: WaitListen(nil)})
	require.NoError(t, err)
	store.Close()
}
