package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
)

// timeoutBundle is a store on a pool of one connection, so that every
// phase runs on the same session, with the statements it sends counted.
type timeoutBundle struct {
	store  *Store
	traced *countingTracer
}

func setupTimeout(t *testing.T) *timeoutBundle {
	t.Helper()
	schema := pgtest.NewMigratedSchema(t)
	cfg, err := pgxpool.ParseConfig(schema.URL)
	require.NoError(t, err)
	traced := &countingTracer{}
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = traced
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := New(pool, &Config{Schema: schema.Name, ControlDB: schema.Pool})
	require.NoError(t, err)
	return &timeoutBundle{store: store, traced: traced}
}

// phase runs one phase with timeout on the store's one connection: it
// reads the statement_timeout its statements run under, then commits (the
// guard a statement that always matches) or rolls back.
func (b *timeoutBundle) phase(t *testing.T, timeout time.Duration, commit bool, statements ...string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.store.beginPhase(ctx, idemdriver.PhaseOptions{Isolation: pgx.ReadCommitted, StatementTimeout: timeout})
	require.NoError(t, err)
	var setting string
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('statement_timeout')`).Scan(&setting))
	for _, sql := range statements {
		_, err := tx.Exec(ctx, sql)
		require.NoError(t, err)
	}
	if commit {
		require.NoError(t, tx.commitGuarded(ctx, `SELECT 1`))
	} else {
		require.NoError(t, tx.RollbackPhase(ctx))
	}
	return setting
}

func (b *timeoutBundle) settings() int { return b.traced.count(b.store.q.statementTimeout) }

// On a connection that talks to its backend directly, the phase statement
// timeout is set for the session once, by the first phase that commits,
// and not again while it holds; a rollback undoes it, a phase with another
// timeout sets its own, a phase statement that may reset it makes the next
// phase set it again, and a phase without a timeout resets it.
func TestPhaseStatementTimeoutSetOncePerConnection(t *testing.T) {
	t.Parallel()
	b := setupTimeout(t)
	const timeout = 1234 * time.Millisecond

	require.Equal(t, "1234ms", b.phase(t, timeout, false))
	require.Equal(t, 1, b.settings())
	require.Equal(t, "1234ms", b.phase(t, timeout, true), "the rollback undid the session's setting: set again")
	require.Equal(t, 2, b.settings())
	for range 3 {
		require.Equal(t, "1234ms", b.phase(t, timeout, true))
	}
	require.Equal(t, 2, b.settings(), "held by the session: not sent again")

	require.Equal(t, "2s", b.phase(t, 2*time.Second, true), "another timeout is set")
	require.Equal(t, 3, b.settings())
	require.Equal(t, "1234ms", b.phase(t, timeout, true))
	require.Equal(t, 4, b.settings())

	require.Equal(t, "1234ms", b.phase(t, timeout, true, `SET statement_timeout = 0`))
	require.Equal(t, 4, b.settings())
	require.Equal(t, "1234ms", b.phase(t, timeout, true), "the phase's SET made the store forget it")
	require.Equal(t, 5, b.settings())

	require.Equal(t, "0", b.phase(t, 0, true), "a phase without a timeout resets the session's")
	require.Equal(t, "1234ms", b.phase(t, timeout, true))
	require.Equal(t, 6, b.settings())

	// The same when the phase's first statement begins the transaction on
	// its own (an Exec without arguments): the BEGIN round trip carries the
	// setting.
	require.Equal(t, "0", b.phaseBegunAlone(t, 0), "reset")
	require.Equal(t, "1234ms", b.phaseBegunAlone(t, timeout))
	require.Equal(t, 7, b.settings())
	require.Equal(t, "1234ms", b.phaseBegunAlone(t, timeout))
	require.Equal(t, 7, b.settings())
}

// phaseBegunAlone is phase whose first statement begins the transaction
// with a round trip of its own, then commits.
func (b *timeoutBundle) phaseBegunAlone(t *testing.T, timeout time.Duration) string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.store.beginPhase(ctx, idemdriver.PhaseOptions{Isolation: pgx.ReadCommitted, StatementTimeout: timeout})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	var setting string
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('statement_timeout')`).Scan(&setting))
	require.NoError(t, tx.commitGuarded(ctx, `SELECT 1`))
	return setting
}
