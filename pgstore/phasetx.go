package pgstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// phaseTx is a phase's transaction, shaped to cost the phase one round trip
// beyond its own statements:
//
//   - BEGIN is not sent on its own. It travels in the same pipeline as the
//     phase's first statement (pgx's Batch.BeginTx), and from then on the
//     real pgx transaction does the work;
//   - the fenced recovery-point update travels in the same pipeline as
//     COMMIT (commitGuarded), and is written to fail, not to match no row,
//     when the fence has moved, so the COMMIT behind it cannot commit a
//     taken-over worker's writes;
//   - a phase that sends no statement of its own (only a foreign call) has
//     no transaction at all: its guarded update runs alone.
//
// The few statements that need the transaction open before they can run
// (CopyFrom, and Exec without arguments, which pgx sends over the simple
// protocol) begin it with a round trip of its own. No statement a phase sends
// may be a transaction-control one, alone or anywhere in a string of several
// (checkStatement): over the simple protocol a COMMIT later in the string
// would commit the phase's writes without their recovery point.
//
// It is the store's own type (idemdriver.PhaseTx): the runner hands its
// statement methods to the phase as idem.Tx and ends it with CommitPhase or
// RollbackPhase; phases have no way to commit it.
type phaseTx struct {
	conn *pgxpool.Conn
	opts pgx.TxOptions
	q    *queries
	// seal seals the response body a finishing phase stores (nil: none).
	seal *sealer
	// stmtTimeout bounds each of the phase's own statements (zero: none).
	stmtTimeout time.Duration
	// sessionTimeout: the statement sent with BEGIN set stmtTimeout for
	// the connection's session, which commit records (timeoutSetting).
	sessionTimeout bool
	// resetsTimeout: a statement of the phase may have changed the
	// session's statement_timeout.
	resetsTimeout bool
	tx            pgx.Tx // the real transaction once begun
	// notifyAfter is the key whose waiters a finishing commit at
	// repeatable read or serializable notifies once more after it commits
	// (ID 0: none): the trigger's call of idem_notify_waiters read the marks
	// with the transaction's snapshot, blind to a mark committed since.
	notifyAfter idemdriver.LockRef
	closed      bool
	// failed is the error of a first statement whose pipeline failed before
	// BEGIN ran (a statement that does not prepare, say). In a transaction
	// begun on its own, that statement would have aborted it; later
	// statements report failed to keep that behaviour.
	failed error
}

var _ idemdriver.PhaseTx = (*phaseTx)(nil)

// millis is d as a setting's value in milliseconds, at least 1 (0 would
// mean no timeout).
func millis(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

// beginTimeout bounds the BEGIN sent by the methods that take no context.
const beginTimeout = 30 * time.Second

func (t *phaseTx) begin(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	if t.failed != nil {
		return fmt.Errorf("pgstore: the phase's transaction failed at its first statement: %w", t.failed)
	}
	if t.tx != nil {
		return nil
	}
	if t.timeoutSetting() != nil {
		// BEGIN and the server-side statement timeout, in one round trip.
		br, err := t.beginWith(ctx, nil)
		if err != nil {
			return err
		}
		return br.Close()
	}
	tx, err := t.conn.Conn().BeginTx(ctx, t.opts)
	if err != nil {
		return err
	}
	t.tx = tx
	return nil
}

// beginWith sends BEGIN and the queued queries of b in one pipeline and
// returns the results positioned after BEGIN's.
func (t *phaseTx) beginWith(ctx context.Context, queued []*pgx.QueuedQuery) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.BeginTx(t.opts)
	setting := t.timeoutSetting()
	if setting != nil {
		b.QueuedQueries = append(b.QueuedQueries, setting)
	}
	b.QueuedQueries = append(b.QueuedQueries, queued...)
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		t.failed = err
		return nil, err
	}
	t.tx = br.(interface{ Tx() pgx.Tx }).Tx()
	if setting != nil {
		var err error
		if t.stmtTimeout > 0 {
			err = br.QueryRow().Scan(&t.sessionTimeout, nil)
		} else {
			_, err = br.Exec()
		}
		if err != nil {
			_ = br.Close()
			t.failed = err
			return nil, err
		}
	}
	return br, nil
}

// sessionTimeoutKey is where a connection's CustomData holds the
// statement_timeout the store set for its whole session (a time.Duration),
// on a connection that talks to its backend directly.
const sessionTimeoutKey = "idem.statement_timeout"

// timeoutSetting is the statement that gives the phase's transaction its
// statement_timeout, to send with BEGIN, or nil when the connection's
// session has it already.
//
// The timeout is set once per connection, for its session, where the
// connection talks to its backend directly: the backend's pid is the one
// it announced (as in checkPooler). Behind a transaction pooler the session
// is not the client connection's (the pooler hands each transaction a
// server connection, which other clients set and reset), so there the
// statement sets it for the transaction alone, every time, as every phase
// did before. The statement decides which on the server, in one go:
// set_config's is_local is "the pid differs". Whether it set the session
// is remembered (CustomData) only once the phase commits: a session
// setting made in a transaction that rolls back is undone with it.
//
// A phase statement that may change the session's timeout itself
// (statementVerdict.mayResetTimeout) makes the store forget it, and so
// does a phase with no timeout (RESET). What an application sends on the
// pool's connections outside phases it cannot see: a phase statement
// stays bounded by its client-side deadline (stmtContext) whatever the
// session says.
func (t *phaseTx) timeoutSetting() *pgx.QueuedQuery {
	data := t.conn.Conn().PgConn().CustomData()
	set, _ := data[sessionTimeoutKey].(time.Duration)
	switch {
	case t.stmtTimeout > 0 && set == t.stmtTimeout && !t.resetsTimeout:
		return nil
	case t.stmtTimeout > 0:
		return &pgx.QueuedQuery{SQL: t.q.statementTimeout, Arguments: []any{millis(t.stmtTimeout), int64(t.conn.Conn().PgConn().PID())}}
	case set > 0:
		return &pgx.QueuedQuery{SQL: t.q.resetStatementTimeout}
	}
	return nil
}

// committed records, once the phase's transaction committed, what its
// statements left of the session's statement_timeout.
func (t *phaseTx) committed() {
	data := t.conn.Conn().PgConn().CustomData()
	switch {
	case t.resetsTimeout || t.stmtTimeout <= 0:
		// A phase without a timeout sent RESET if the session had one.
		delete(data, sessionTimeoutKey)
	case t.sessionTimeout:
		data[sessionTimeoutKey] = t.stmtTimeout
	}
}

// sent notes what a phase statement may do to the session's settings.
func (t *phaseTx) sent(v *statementVerdict) error {
	if v.mayResetTimeout && !t.resetsTimeout {
		t.resetsTimeout = true
		delete(t.conn.Conn().PgConn().CustomData(), sessionTimeoutKey)
	}
	return v.err
}

// serverTimeoutGrace is how long after the server-side statement_timeout a
// phase statement's client-side deadline falls: the server's 57014
// (query_canceled) arrives first, and pgx keeps the connection. At its own
// deadline pgx would interrupt it: by default it drops the connection
// mid-statement; configured to, it sends a cancel request, a second
// connection that a pooler must route to the right server connection.
// PgBouncer 1.18 has been seen to exit on both. The client deadline is only
// for a server that does not answer at all.
const serverTimeoutGrace = time.Second

// stmtContext bounds one of the phase's statements: the server ends it at
// stmtTimeout (statement_timeout, set for the transaction with BEGIN), the
// client at stmtTimeout plus serverTimeoutGrace. cancel must run when the
// statement's results are done with, not when the call returns: pgx reads
// rows under the context the query was sent with.
func (t *phaseTx) stmtContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if t.stmtTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, t.stmtTimeout+serverTimeoutGrace)
}

// lazy reports whether the next statement can carry BEGIN.
func (t *phaseTx) lazy() bool { return t.tx == nil && !t.closed && t.failed == nil }

// needsOwnBegin reports whether a statement cannot ride in a pipeline with
// BEGIN: pgx runs argument-less Exec over the simple protocol (which allows
// several statements in one string), and batches honour no query options
// other than a QueryRewriter.
func needsOwnBegin(exec bool, args []any) bool {
	if exec && len(args) == 0 {
		return true
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return true
		}
	}
	return false
}

func (t *phaseTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.sent(verdictOf(sql)); err != nil {
		return pgconn.CommandTag{}, err
	}
	ctx, cancel := t.stmtContext(ctx)
	defer cancel()
	if t.lazy() && !needsOwnBegin(true, args) {
		br, err := t.beginWith(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return tag, err
	}
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, args...)
}

func (t *phaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.sent(verdictOf(sql)); err != nil {
		return failedRows(err)
	}
	ctx, cancel := t.stmtContext(ctx)
	rows, err := t.query(ctx, sql, args...)
	if err != nil {
		cancel()
		return rows, err
	}
	return &boundedRows{Rows: rows, cancel: cancel}, nil
}

func (t *phaseTx) query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.lazy() && !needsOwnBegin(false, args) {
		br, err := t.beginWith(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
		if err != nil {
			return failedRows(err)
		}
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return failedRows(err)
		}
		return &batchRows{Rows: rows, br: br}, nil
	}
	if err := t.begin(ctx); err != nil {
		return failedRows(err)
	}
	return t.tx.Query(ctx, sql, args...)
}

func (t *phaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &row{rows: rows, err: err}
}

func (t *phaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if err := t.sent(verdictOf(q.SQL)); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	ctx, cancel := t.stmtContext(ctx)
	return &boundedBatch{BatchResults: t.sendBatch(ctx, b), cancel: cancel}
}

func (t *phaseTx) sendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.lazy() {
		br, err := t.beginWith(ctx, b.QueuedQueries)
		if err != nil {
			return pgx.FailedBatchResults(b, err)
		}
		return br
	}
	if err := t.begin(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

func (t *phaseTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	ctx, cancel := t.stmtContext(ctx)
	defer cancel()
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// RollbackPhase implements idemdriver.PhaseTx: it rolls back; a transaction that never began costs no round trip.
func (t *phaseTx) RollbackPhase(ctx context.Context) error {
	if t.closed {
		return nil
	}
	defer t.release()
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// connectionLost reports whether the phase's connection died under it: the
// one sure sign that a network error in the phase came from the database.
func (t *phaseTx) connectionLost() bool {
	return !t.closed && t.conn.Conn().IsClosed()
}

func (t *phaseTx) release() {
	t.closed = true
	// pgxpool closes rather than reuses a connection left inside a
	// transaction, so a failed rollback cannot leak one.
	t.conn.Release()
}

// fenceMovedCode is what the guard statement raises when it matches no
// row: the division by a zero count (SQLSTATE 22012) in queries.advancePhase
// and queries.finishPhase.
const fenceMovedCode = "22012"

// commitGuarded runs the phase's guarded recovery-point update and commits,
// in one round trip. It returns errLockLost when the guard found the fence
// moved; the transaction is then rolled back.
func (t *phaseTx) commitGuarded(ctx context.Context, guard string, args ...any) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	if t.failed != nil {
		defer t.release()
		return fmt.Errorf("pgstore: the phase's transaction failed at its first statement: %w", t.failed)
	}
	if t.tx == nil {
		// Nothing ran in a transaction: the guarded update is the phase's
		// only write, and commits on its own.
		defer t.release()
		_, err := t.conn.Exec(ctx, guard, args...)
		return classifyGuard(err)
	}
	if status := t.conn.Conn().PgConn().TxStatus(); status == 'I' {
		// The phase ended its transaction itself (a COMMIT or ROLLBACK sent
		// as a statement, or through the connection): whatever it wrote is
		// no longer tied to the recovery point, and the guard must not run
		// outside a transaction.
		defer t.release()
		return ErrPhaseEndedTx
	}
	b := &pgx.Batch{}
	b.Queue(guard, args...)
	b.Queue("commit")
	br := t.tx.SendBatch(ctx, b)
	_, guardErr := br.Exec()
	tag, commitErr := br.Exec()
	closeErr := br.Close()
	if guardErr != nil {
		// The pipeline skipped the COMMIT; the transaction is aborted.
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), beginTimeout)
		defer cancel()
		_ = t.tx.Rollback(rbCtx)
		t.release()
		return classifyGuard(guardErr)
	}
	defer t.release()
	if err := errors.Join(commitErr, closeErr); err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		// The transaction was already failed (a statement error the phase
		// ignored), so COMMIT rolled it back.
		return fmt.Errorf("%w: the phase's transaction was rolled back at commit", pgx.ErrTxCommitRollback)
	}
	t.committed()
	if t.notifyAfter.ID != 0 {
		// One more round trip, at read committed, for the marks the
		// finishing statement's snapshot could not see. A failure only
		// leaves the waiters to their watch's recheck.
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), beginTimeout)
		defer cancel()
		_, _ = t.conn.Exec(nctx, t.q.notifyWaiters, t.notifyAfter.Scope, t.notifyAfter.ID)
	}
	return nil
}

// ErrPhaseEndedTx is the phase failure of a phase that ended its own
// transaction: a transaction-control statement (COMMIT, ROLLBACK, BEGIN,
// END, ABORT, SAVEPOINT and their kin) sent through its Tx, alone or in a
// string of several statements, is refused before it reaches the server,
// and a transaction found over at commit (ended through the connection)
// fails the phase.
var ErrPhaseEndedTx = errors.New("pgstore: a phase may not end or nest its transaction; the runner commits it with the recovery point")

// txControl matches a statement that starts with a transaction-control
// keyword, after whitespace and comments.
var txControl = regexp.MustCompile(`(?is)^(?:\s+|--[^\n]*\n|/\*.*?\*/)*(commit|rollback|begin|end|abort|start\s+transaction|savepoint|release|prepare\s+transaction)\b`)

// refuseTxControl refuses a transaction-control statement sent through a
// phase's Tx: the runner owns the transaction. (pgx.Tx's savepoints stay
// available through Attempt.PgxTx's Begin.)
func refuseTxControl(sql string) error {
	if m := txControl.FindStringSubmatch(sql); m != nil {
		return fmt.Errorf("%w: %q", ErrPhaseEndedTx, strings.ToUpper(m[1]))
	}
	return nil
}

func classifyGuard(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == fenceMovedCode {
		return errLockLost
	}
	return err
}

var errLockLost = errors.New("pgstore: fence moved on")

// batchRows are the rows of a query that travelled with BEGIN: when they
// are done, the rest of the batch must be closed before the connection can
// be used again.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	finished bool
	closeErr error
}

func (r *batchRows) finish() {
	if !r.finished {
		r.finished = true
		r.closeErr = r.br.Close()
	}
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	r.finish()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// row is pgx's QueryRow contract over phaseTx.Query.
type row struct {
	rows pgx.Rows
	err  error
}

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		r.rows.Close()
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// failedRows are pgx's own rows for a query that failed before it could be
// read, for callers that use the rows without checking the error.
func failedRows(err error) (pgx.Rows, error) {
	return pgx.FailedBatchResults(&pgx.Batch{}, err).Query()
}

// CommitPhase implements idemdriver.PhaseTx: the fenced recovery-point update
// and COMMIT, in one round trip.
func (t *phaseTx) CommitPhase(ctx context.Context, p idemdriver.CommitParams) error {
	bodyKeyID := ""
	if p.Response != nil && t.seal != nil {
		resp := *p.Response
		var err error
		if bodyKeyID, resp.Body, err = t.seal.sealBody(p); err != nil {
			_ = t.RollbackPhase(ctx)
			return err
		}
		p.Response = &resp
	}
	sql, args, err := t.q.commitStatement(p, bodyKeyID)
	if err != nil {
		_ = t.RollbackPhase(ctx)
		return err
	}
	if sql == t.q.finishPhase && !t.q.citus && t.opts.IsoLevel != pgx.ReadCommitted && t.opts.IsoLevel != pgx.ReadUncommitted {
		t.notifyAfter = p.Ref
	}
	err = t.commitGuarded(ctx, sql, args...)
	switch {
	case errors.Is(err, errLockLost):
		return fmt.Errorf("%w: fence %d of key %d moved on", idemtype.ErrLockLost, p.Ref.Fence, p.Ref.ID)
	case err != nil:
		return mapError(fmt.Errorf("pgstore: commit phase: %w", err))
	}
	return nil
}

// ClassifyError implements idemdriver.PhaseTx. Only what certainly comes from
// the database is classified: Postgres's error codes, a failed connect, and
// the phase's own connection having closed. A phase's foreign call may fail
// with network errors of its own, which are none of the store's business.
func (t *phaseTx) ClassifyError(err error) error {
	if t.stmtTimeout > 0 && statementTimedOut(err) {
		// The server ended a statement at the phase's statement timeout
		// (before the client's own deadline, serverTimeoutGrace later): as
		// documented, a statement that runs out is the store not answering
		// in time.
		return fmt.Errorf("%w: a statement ran past the phase statement timeout (%s): %w: %w",
			idemtype.ErrStoreUnavailable, t.stmtTimeout, context.DeadlineExceeded, err)
	}
	if mapped, ok := mapPgError(err); ok {
		return mapped
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return fmt.Errorf("%w: %w", idemtype.ErrStoreUnavailable, err)
	}
	if ownStatementError(err) {
		// pgx closes the connection of a pipeline it could not build, but
		// the database had nothing to do with it.
		return err
	}
	if t.connectionLost() {
		return fmt.Errorf("%w: the phase's connection closed: %w", idemtype.ErrStoreUnavailable, err)
	}
	return err
}

// boundedRows cancels the statement's deadline when the rows are done.
type boundedRows struct {
	pgx.Rows
	cancel context.CancelFunc
}

func (r *boundedRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.cancel()
	return false
}

func (r *boundedRows) Close() {
	r.Rows.Close()
	r.cancel()
}

// boundedBatch cancels the batch's deadline when its results are closed.
type boundedBatch struct {
	pgx.BatchResults
	cancel context.CancelFunc
}

func (b *boundedBatch) Close() error {
	defer b.cancel()
	return b.BatchResults.Close()
}

// PgxTx implements idemdriver.PhaseTx: the phase's transaction with pgx.Tx's
// full method set, Commit and Rollback disarmed.
func (t *phaseTx) PgxTx() pgx.Tx { return pgxView{t: t} }

// pgxView is PgxTx's view: the phase's transaction with pgx.Tx's full method
// set and Commit and Rollback disarmed.
type pgxView struct{ t *phaseTx }

func (v pgxView) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return v.t.Exec(ctx, sql, args...)
}

func (v pgxView) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return v.t.Query(ctx, sql, args...)
}

func (v pgxView) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return v.t.QueryRow(ctx, sql, args...)
}

func (v pgxView) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return v.t.SendBatch(ctx, b)
}

func (v pgxView) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return v.t.CopyFrom(ctx, table, columns, src)
}

var _ pgx.Tx = pgxView{}

func (v pgxView) Commit(context.Context) error   { return idemtype.ErrPhaseOwnsTx }
func (v pgxView) Rollback(context.Context) error { return idemtype.ErrPhaseOwnsTx }

func (v pgxView) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := v.t.begin(ctx); err != nil {
		return nil, err
	}
	return v.t.tx.Prepare(ctx, name, sql)
}

// Begin starts a pseudo nested transaction (a savepoint) in the phase's
// transaction.
func (v pgxView) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := v.t.begin(ctx); err != nil {
		return nil, err
	}
	return v.t.tx.Begin(ctx)
}

// LargeObjects begins the transaction first, since large objects only work
// inside one. It has no context, so that BEGIN is bounded by a timeout; if it
// fails, every large-object call reports a closed transaction.
func (v pgxView) LargeObjects() pgx.LargeObjects {
	ctx, cancel := context.WithTimeout(context.Background(), beginTimeout)
	defer cancel()
	if err := v.t.begin(ctx); err != nil {
		b := &pgx.Batch{}
		b.BeginTx(v.t.opts)
		return pgx.FailedBatchResults(b, err).(interface{ Tx() pgx.Tx }).Tx().LargeObjects()
	}
	return v.t.tx.LargeObjects()
}

// Conn returns the phase's connection. It begins the transaction first, so
// that statements sent straight on the connection are still inside it.
func (v pgxView) Conn() *pgx.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), beginTimeout)
	defer cancel()
	_ = v.t.begin(ctx) // a failure resurfaces on the next statement
	return v.t.conn.Conn()
}

// ownStatementError reports whether err is pgx failing to encode a
// statement's arguments (client side, before the server saw it): the
// statement's own fault, never the store's, even when pgx closed the
// connection of the pipeline it was part of.
func ownStatementError(err error) bool {
	var pre pgx.ErrPreprocessingBatch
	return errors.As(err, &pre) && strings.HasPrefix(pre.Error(), "error preprocessing batch (build)")
}

// statementTimedOut reports whether err is the server ending a statement at
// its statement_timeout (57014 query_canceled, which a cancel request or
// pg_cancel_backend also raise, with other messages).
func statementTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014" && strings.Contains(pgErr.Message, "statement timeout")
}
