package ridesapp_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/internal/pgtest"
)

// Behind a transaction pooler, a statement whose context ends sends no
// cancel request (PgBouncer 1.18 may exit on one whose client hangs up
// early, pgbouncer#801): the connection is dropped instead, and the
// statement returns at once all the same.
func TestPoolBehindPoolerSendsNoCancelRequest(t *testing.T) {
	t.Parallel()
	bounced := pgtest.NewBouncedSchema(t)
	url := bounced.BouncedURL + "&default_query_exec_mode=exec"
	_, pooled, err := ridesapp.ParsePoolConfig(t.Context(), url)
	require.NoError(t, err)
	require.True(t, pooled, "the bouncer is a pooler")
	// Counted on the wire, under what ParsePoolConfig sets.
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cancels := pgtest.CountCancelRequests(cfg.ConnConfig)
	ridesapp.SendNoCancelRequests(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = pool.Exec(ctx, "SELECT pg_sleep(60)")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var one int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT 1").Scan(&one), "the pool works on")
	pool.Close() // waits for the interrupted connection's close, which would send the cancel
	require.Zero(t, cancels.Load(), "no cancel request through the pooler")
	require.True(t, bounced.Bouncer.Alive(), "pgbouncer exited:\n%s", bounced.Bouncer.Log())
}

// A direct connection is no pooler, and keeps pgx's cancel requests, which
// stop a statement on the server when its client gives up.
func TestPoolDirectIsNotPooled(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	_, pooled, err := ridesapp.ParsePoolConfig(t.Context(), schema.URL)
	require.NoError(t, err)
	require.False(t, pooled, "a direct connection")
}
