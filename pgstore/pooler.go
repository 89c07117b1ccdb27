package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrPoolerExecMode is wrapped by the error New returns for a pool whose
// query exec mode cannot work through the connection pooler in front of
// Postgres: a pooler in transaction mode (PgBouncer pool_mode=transaction)
// that hands each transaction a server connection of its own and does not
// manage prepared statements itself (PgBouncer before 1.21, or
// max_prepared_statements = 0).
var ErrPoolerExecMode = errors.New("pgstore: the pool's query exec mode does not work through the connection pooler in front of Postgres")

// BehindPooler reports whether conn reaches PostgreSQL through a connection
// pooler: a pooler announces a backend pid of its own making (BackendKeyData),
// not the server's pg_backend_pid(). One round trip, in the simple protocol,
// so it works through any pooler. Behind a transaction pooler an
// application should not LISTEN, nor let pgx send cancel requests
// (docs/operations.md, "Cancel requests").
func BehindPooler(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var backend uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&backend); err != nil {
		return false, fmt.Errorf("pgstore: ask the server for its backend pid: %w", err)
	}
	return backend != conn.PgConn().PID(), nil
}

// checkPooler refuses, on a pool behind a transaction pooler, the query
// exec modes that need a statement prepared in one transaction to exist in
// the next:
//
//   - cache_statement (pgx's default) prepares named statements once per
//     connection and reuses them; the pooler may send the reuse to another
//     server connection ("prepared statement ... does not exist", or
//     "already exists" for another client);
//   - describe_exec describes and executes a statement in two messages,
//     each ending with a Sync; outside a transaction the pooler may route
//     the second to another server connection.
//
// A pooler is detected by the backend pid it announces to the client
// (BackendKeyData), which a pooler makes up: it differs from the server's
// pg_backend_pid(). A pooler that manages prepared statements itself
// (PgBouncer 1.21+ with max_prepared_statements) renames them on the
// server, so a statement the probe prepares under a name of its own shows
// under another name in pg_prepared_statements; cache_statement is then
// accepted. The probe's statements use the simple protocol and leave
// nothing behind; on a direct connection it costs one round trip. A
// database that does not answer is not checked, as in checkSchema.
func (s *Store) checkPooler(ctx context.Context, pool *pgxpool.Pool) error {
	mode := pool.Config().ConnConfig.DefaultQueryExecMode
	if mode != pgx.QueryExecModeCacheStatement && mode != pgx.QueryExecModeDescribeExec {
		return nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil
	}
	defer conn.Release()
	if pooled, err := BehindPooler(ctx, conn.Conn()); err != nil || !pooled {
		return nil // no pooler (the client talks to the backend itself), or no answer
	}
	const use = "use default_query_exec_mode=exec (or cache_describe, or simple_protocol) in the URL (pgx.ConnConfig.DefaultQueryExecMode), " +
		"or set Config.Wait to WaitListen(nil) for a pooler in session mode"
	if mode == pgx.QueryExecModeDescribeExec {
		return fmt.Errorf("%w: describe_exec sends a statement's description and its execution in two synced messages, which a transaction pooler may route to different server connections; %s",
			ErrPoolerExecMode, use)
	}
	// In one transaction, so that the pooler keeps one server connection.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	name := "idem_pooler_probe_" + randomHex()
	if _, err := conn.Conn().PgConn().Prepare(ctx, name, "SELECT 1", nil); err != nil {
		return nil
	}
	var passedThrough bool
	err = tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_prepared_statements WHERE name = $1)",
		pgx.QueryExecModeSimpleProtocol, name).Scan(&passedThrough)
	_ = conn.Conn().PgConn().Deallocate(ctx, name)
	if err != nil || !passedThrough {
		return nil // the pooler keeps prepared statements of its own
	}
	return fmt.Errorf("%w: cache_statement (pgx's default) reuses named prepared statements across transactions, and this pooler passes them to whichever server connection it picks (PgBouncer before 1.21, or max_prepared_statements = 0); %s, or enable the pooler's prepared statement support",
		ErrPoolerExecMode, use)
}
