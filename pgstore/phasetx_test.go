package pgstore

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type txBundle struct {
	schema *pgtest.Schema
	store  *Store
}

func setupTx(t *testing.T) *txBundle {
	t.Helper()
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(context.Background(), `CREATE TABLE items (id int PRIMARY KEY, name text)`)
	require.NoError(t, err)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	return &txBundle{schema: schema, store: store}
}

func (b *txBundle) begin(t *testing.T) *phaseTx {
	t.Helper()
	ptx, err := b.store.beginPhase(context.Background(), idemdriver.PhaseOptions{Isolation: pgx.ReadCommitted})
	require.NoError(t, err)
	// A failing test must still hand the connection back, or dropping the
	// schema waits on it forever.
	t.Cleanup(func() {
		if !ptx.closed {
			_ = ptx.RollbackPhase(context.Background())
		}
	})
	return ptx
}

func (b *txBundle) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM items`).Scan(&n))
	return n
}

// inTransaction reports whether the phase's connection is inside a
// transaction, as the server sees it.
func inTransaction(tx *phaseTx) bool { return tx.conn.Conn().PgConn().TxStatus() != 'I' }

func TestPhaseTxBeginsWithTheFirstStatement(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	ctx := context.Background()
	tx := b.begin(t)
	require.False(t, inTransaction(tx), "nothing is sent before the first statement")

	var id int
	require.NoError(t, tx.QueryRow(ctx, `INSERT INTO items VALUES ($1, $2) RETURNING id`, 1, "a").Scan(&id))
	require.Equal(t, 1, id)
	require.True(t, inTransaction(tx))
	tag, err := tx.Exec(ctx, `INSERT INTO items VALUES ($1, $2)`, 2, "b")
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
	require.Equal(t, 0, b.count(t), "uncommitted")
	require.NoError(t, tx.RollbackPhase(ctx))
	require.Equal(t, 0, b.count(t))
	require.NoError(t, tx.RollbackPhase(ctx), "a second rollback is a no-op")
}

func TestPhaseTxEveryFirstStatementKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, first := range map[string]func(t *testing.T, tx *phaseTx){
		"exec with args": func(t *testing.T, tx *phaseTx) {
			_, err := tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'x')`, 1)
			require.NoError(t, err)
		},
		"exec without args, two statements": func(t *testing.T, tx *phaseTx) {
			_, err := tx.Exec(ctx, `INSERT INTO items VALUES (1, 'x'); SET LOCAL lock_timeout = '5s'`)
			require.NoError(t, err)
		},
		"query": func(t *testing.T, tx *phaseTx) {
			rows, err := tx.Query(ctx, `INSERT INTO items VALUES ($1, 'x') RETURNING id`, 1)
			require.NoError(t, err)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
			require.NoError(t, err)
			require.Equal(t, []int{1}, ids)
		},
		"query read half-way then closed": func(t *testing.T, tx *phaseTx) {
			rows, err := tx.Query(ctx, `INSERT INTO items SELECT g, 'x' FROM generate_series(1, 1) g RETURNING id`)
			require.NoError(t, err)
			rows.Close()
			require.NoError(t, rows.Err())
		},
		"batch": func(t *testing.T, tx *phaseTx) {
			batch := &pgx.Batch{}
			batch.Queue(`INSERT INTO items VALUES ($1, 'x')`, 1)
			batch.Queue(`SELECT count(*) FROM items`)
			br := tx.SendBatch(ctx, batch)
			_, err := br.Exec()
			require.NoError(t, err)
			var n int
			require.NoError(t, br.QueryRow().Scan(&n))
			require.Equal(t, 1, n)
			require.NoError(t, br.Close())
		},
		"copy": func(t *testing.T, tx *phaseTx) {
			n, err := tx.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "name"}, pgx.CopyFromRows([][]any{{1, "x"}}))
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
		},
		"savepoint (PgxTx view)": func(t *testing.T, tx *phaseTx) {
			sp, err := pgxView{tx}.Begin(ctx)
			require.NoError(t, err)
			_, err = sp.Exec(ctx, `INSERT INTO items VALUES (99, 'rolled back')`)
			require.NoError(t, err)
			require.NoError(t, sp.Rollback(ctx))
			_, err = tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'x')`, 1)
			require.NoError(t, err)
		},
		"conn (PgxTx view)": func(t *testing.T, tx *phaseTx) {
			_, err := pgxView{tx}.Conn().Exec(ctx, `INSERT INTO items VALUES ($1, 'x')`, 1)
			require.NoError(t, err)
		},
		"large objects (PgxTx view)": func(t *testing.T, tx *phaseTx) {
			los := pgxView{tx}.LargeObjects()
			oid, err := los.Create(ctx, 0)
			require.NoError(t, err)
			require.NoError(t, los.Unlink(ctx, oid))
			_, err = tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'x')`, 1)
			require.NoError(t, err)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupTx(t)
			tx := b.begin(t)
			first(t, tx)
			require.True(t, inTransaction(tx), "the statement ran inside the transaction")
			require.Equal(t, 0, b.count(t), "and nothing is visible before the commit")
			require.NoError(t, tx.commitGuarded(ctx, `SELECT 1`))
			require.Equal(t, 1, b.count(t))
		})
	}
}

func TestPhaseTxFirstStatementErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, first := range map[string]string{
		"fails when executed": `SELECT 1 / $1::int`,              // BEGIN ran; the transaction is aborted
		"fails to prepare":    `INSERT INTO nowhere VALUES ($1)`, // the pipeline failed before BEGIN ran
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupTx(t)
			tx := b.begin(t)
			_, err := tx.Exec(ctx, first, 0)
			require.Error(t, err)
			// As in any transaction, nothing after a failed statement runs.
			_, err = tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'after')`, 1)
			require.Error(t, err)
			require.Error(t, tx.commitGuarded(ctx, `SELECT 1`))
			require.Equal(t, 0, b.count(t))
		})
	}

	b := setupTx(t)
	tx := b.begin(t)
	var n int
	err := tx.QueryRow(ctx, `SELECT id FROM items WHERE id = $1`, 42).Scan(&n)
	require.ErrorIs(t, err, pgx.ErrNoRows)
	require.NoError(t, tx.RollbackPhase(ctx))
}

func TestPhaseTxRollbackOfAnUnbegunTransactionSendsNothing(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	tx := b.begin(t)
	require.NoError(t, tx.RollbackPhase(context.Background()))
	require.ErrorIs(t, tx.commitGuarded(context.Background(), `SELECT 1`), pgx.ErrTxClosed)
	require.NoError(t, tx.RollbackPhase(context.Background()), "a second rollback is a no-op")
}

// The guarded commit: a matching fence commits the phase's writes with the
// update; a moved fence fails the update, so the pipelined COMMIT cannot
// commit, and the writes roll back.
func TestCommitGuardedCommitsOnlyUnderTheFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	guard := `WITH g AS (UPDATE items SET name = 'guarded' WHERE id = 0 AND name = $1 RETURNING 1) SELECT 1 / count(*)::int FROM g`
	for name, tc := range map[string]struct {
		fence     string
		statement bool
		wantErr   error
		wantRows  int
	}{
		"fence held":                {"fence-1", true, nil, 2},
		"fence moved":               {"fence-0", true, errLockLost, 1},
		"fence held, no statement":  {"fence-1", false, nil, 1},
		"fence moved, no statement": {"fence-0", false, errLockLost, 1},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupTx(t)
			_, err := b.schema.Pool.Exec(ctx, `INSERT INTO items VALUES (0, 'fence-1')`)
			require.NoError(t, err)
			tx := b.begin(t)
			if tc.statement {
				_, err := tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'phase write')`, 1)
				require.NoError(t, err)
			}
			err = tx.commitGuarded(ctx, guard, tc.fence)
			if tc.wantErr != nil {
				require.True(t, errors.Is(err, tc.wantErr), "got %v", err)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.wantRows, b.count(t))
			require.True(t, tx.closed, "the connection went back to the pool")
		})
	}
}

func TestCommitGuardedReportsARolledBackTransaction(t *testing.T) {
	t.Parallel()
	b := setupTx(t)
	ctx := context.Background()
	tx := b.begin(t)
	_, err := tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'x')`, 1)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'dup')`, 1) // the phase ignores this error
	require.Error(t, err)
	err = tx.commitGuarded(ctx, `SELECT 1`)
	require.Error(t, err)
	require.Equal(t, 0, b.count(t))
}
