package idem

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is a phase's transaction as the phase sees it: statements, and nothing
// that ends the transaction. The runner commits it together with the key's new
// recovery point, or rolls it back, so a phase can neither commit its writes
// without the recovery point nor outlive its transaction. A
// transaction-control statement sent through it (COMMIT, ROLLBACK, BEGIN and
// their kin), alone or anywhere in a string of several statements, is
// refused before it reaches the server (pgstore.ErrPhaseEndedTx).
//
// It is the DBTX shape that sqlc generates for pgx/v5 (Exec, Query, QueryRow,
// plus CopyFrom and SendBatch for :copyfrom and :batch queries), so
// sqlc-generated queries run inside a phase with db.New(tx). Queries built on
// the pool instead run outside the phase's transaction and break its
// atomicity: build them on tx.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}
