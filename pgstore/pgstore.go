// Package pgstore is idem's Postgres store, on pgx/v5.
//
// All of idem's SQL lives in this package (queries.go), and every error that
// comes back from the driver passes through one function, mapError, which
// turns connection failures into idem.ErrStoreUnavailable and serialization
// failures and deadlocks into idem.ErrSerialization. The tables must exist:
// apply the migrations package first.
//
//	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	store, _ := pgstore.New(pool, &pgstore.Config{Schema: "idem"})
//	runner, _ := idem.NewRunner(store, nil)
//
// A running request holds up to two connections: its phase transaction and,
// briefly, its heartbeat. Size the pool for that.
package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/migrations"
)

// Config configures a [Store].
type Config struct {
	// Schema holds idem's tables; it must match the schema the migrations
	// were applied to. Empty (the default) leaves table names unqualified,
	// so they resolve through the connection's search_path.
	Schema string
}

// DB is what the store needs from a connection pool. *pgxpool.Pool
// implements it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var _ DB = (*pgxpool.Pool)(nil)

// Store implements idem.Store on Postgres.
type Store struct {
	db DB
	q  *queries
}

var _ idem.Store = (*Store)(nil)

// New returns a store on db. A nil config means the defaults.
func New(db DB, config *Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgstore: New needs a database handle")
	}
	if config == nil {
		config = &Config{}
	}
	prefix, err := migrations.QualifiedPrefix(config.Schema)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	return &Store{db: db, q: newQueries(prefix)}, nil
}

// DB returns the handle the store runs on.
func (s *Store) DB() DB { return s.db }

// Table returns the keys table's (possibly schema-qualified) name, for
// applications that reference it from their own tables.
func (s *Store) Table() string { return s.q.table }

// maxAcquireStatements bounds the re-runs of the acquisition statement. A
// re-run is needed only when a concurrent insert of the same key committed
// after the statement's snapshot was taken, which one more statement sees.
const maxAcquireStatements = 4

// Acquire implements idem.Store.
func (s *Store) Acquire(ctx context.Context, p idem.AcquireParams) (*idem.AcquireResult, error) {
	for i := 0; i < maxAcquireStatements; i++ {
		res, err := s.acquisition(ctx, s.q.acquire,
			p.Now, p.Scope, p.Key, p.Flow, p.Method, p.Path, p.Fingerprint, json.RawMessage(p.Params), p.Lease.Microseconds())
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, mapError(fmt.Errorf("pgstore: acquire: %w", err))
		}
		res.Retried = i
		if rec := res.Record; res.Acquired == idem.AcquiredNone && rec.Status == idem.StatusRunning &&
			rec.Flow == p.Flow && bytes.Equal(rec.Fingerprint, p.Fingerprint) && rec.Method == p.Method && rec.Path == p.Path &&
			!rec.Locked(res.DBNow) {
			// Nobody holds this unfinished key: take it over.
			taken, err := s.acquisition(ctx, s.q.takeOver, p.Now, rec.ID, p.Flow, p.Fingerprint, p.Lease.Microseconds(), p.Method, p.Path)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				// Another worker took it (or finished it) first; report
				// the row as it was, which reads as in progress.
			case err != nil:
				return nil, mapError(fmt.Errorf("pgstore: take over: %w", err))
			default:
				taken.Retried = i
				return taken, nil
			}
		}
		return res, nil
	}
	return nil, fmt.Errorf("pgstore: acquire: key %q kept appearing and disappearing under concurrent writers", p.Key)
}

// acquisition runs a statement that returns (acquired, db_now, key
// columns) and scans its one row; pgx.ErrNoRows when there is none.
func (s *Store) acquisition(ctx context.Context, sql string, args ...any) (*idem.AcquireResult, error) {
	res := &idem.AcquireResult{Record: &idem.KeyRecord{}}
	dest := append([]any{&res.Acquired, &res.DBNow}, recordDest(res.Record)...)
	if err := s.db.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		return nil, err
	}
	return res, nil
}

// ClaimReconcile implements idem.Store.
func (s *Store) ClaimReconcile(ctx context.Context, p idem.ClaimParams) (*idem.AcquireResult, error) {
	res, err := s.acquisition(ctx, s.q.claimReconcile, p.Now, p.Scope, p.Key, p.Lease.Microseconds())
	if errors.Is(err, pgx.ErrNoRows) {
		return &idem.AcquireResult{Acquired: idem.AcquiredNone}, nil
	}
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: claim for reconcile: %w", err))
	}
	return res, nil
}

// BeginPhase implements idem.Store.
//
// The transaction it returns sends BEGIN together with the phase's first
// statement and its guarded commit in one round trip (see phaseTx), so a
// phase costs one round trip beyond its own statements.
func (s *Store) BeginPhase(ctx context.Context, iso pgx.TxIsoLevel) (pgx.Tx, error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: begin phase: %w", err))
	}
	return &phaseTx{conn: conn, opts: pgx.TxOptions{IsoLevel: iso}}, nil
}

// CommitPhase implements idem.Store.
func (s *Store) CommitPhase(ctx context.Context, tx pgx.Tx, p idem.CommitParams) error {
	patch := []byte("{}")
	if len(p.CheckpointPatch) > 0 {
		var err error
		if patch, err = json.Marshal(p.CheckpointPatch); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("pgstore: encode checkpoint: %w", err)
		}
	}
	var sql string
	var args []any
	switch {
	case p.Status == idem.StatusFinished && p.Response != nil:
		body, header := p.Response.Body, p.Response.Header
		if body == nil {
			body = []byte{}
		}
		if header == nil {
			header = map[string][]string{}
		}
		sql = s.q.finishPhase
		args = []any{p.Ref.ID, p.Ref.Fence, json.RawMessage(patch), p.Response.Status, header, body, p.Retention.Microseconds(), p.Now}
	case p.Status == idem.StatusRunning:
		sql = s.q.advancePhase
		args = []any{p.Ref.ID, p.Ref.Fence, p.RecoveryPoint, json.RawMessage(patch), p.Lease.Microseconds(), p.Now}
	default:
		_ = tx.Rollback(ctx)
		return fmt.Errorf("pgstore: commit phase: status %q (with a response: %t) is neither an advance nor a finish", p.Status, p.Response != nil)
	}
	var err error
	if ptx, ok := tx.(*phaseTx); ok {
		err = ptx.commitGuarded(ctx, sql, args...)
	} else {
		// A transaction from elsewhere: the same guard, then its own COMMIT.
		if _, err = tx.Exec(ctx, sql, args...); err == nil {
			err = tx.Commit(ctx)
		} else {
			_ = tx.Rollback(ctx)
			err = classifyGuard(err)
		}
	}
	switch {
	case errors.Is(err, errLockLost):
		return fmt.Errorf("%w: fence %d of key %d moved on", idem.ErrLockLost, p.Ref.Fence, p.Ref.ID)
	case err != nil:
		return mapError(fmt.Errorf("pgstore: commit phase: %w", err))
	}
	return nil
}

// Heartbeat implements idem.Store.
func (s *Store) Heartbeat(ctx context.Context, ref idem.LockRef, lease time.Duration, now *time.Time) (time.Time, error) {
	var expires time.Time
	err := s.db.QueryRow(ctx, s.q.heartbeat, ref.ID, ref.Fence, lease.Microseconds(), now).Scan(&expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("%w: heartbeat found fence %d of key %d gone", idem.ErrLockLost, ref.Fence, ref.ID)
	}
	if err != nil {
		return time.Time{}, mapError(fmt.Errorf("pgstore: heartbeat: %w", err))
	}
	return expires, nil
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, ref idem.LockRef, lastError string) error {
	return s.guarded(ctx, "release", ref, s.q.release, ref.ID, ref.Fence, lastError)
}

// MarkForeign implements idem.Store.
func (s *Store) MarkForeign(ctx context.Context, ref idem.LockRef, phase string) error {
	return s.guarded(ctx, "mark foreign call", ref, s.q.markForeign, ref.ID, ref.Fence, phase)
}

// SetNeedsReconcile implements idem.Store.
func (s *Store) SetNeedsReconcile(ctx context.Context, ref idem.LockRef, reason string) error {
	return s.guarded(ctx, "set needs-reconcile", ref, s.q.setNeedsReconcile, ref.ID, ref.Fence, reason)
}

func (s *Store) guarded(ctx context.Context, what string, ref idem.LockRef, sql string, args ...any) error {
	tag, err := s.db.Exec(ctx, sql, args...)
	if err != nil {
		return mapError(fmt.Errorf("pgstore: %s: %w", what, err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s: fence %d of key %d moved on", idem.ErrLockLost, what, ref.Fence, ref.ID)
	}
	return nil
}

// GetKey implements idem.Store.
func (s *Store) GetKey(ctx context.Context, scope, key string) (*idem.KeyRecord, error) {
	return s.getKey(ctx, s.db, scope, key)
}

// GetKeyTx is GetKey inside the caller's transaction.
func (s *Store) GetKeyTx(ctx context.Context, tx pgx.Tx, scope, key string) (*idem.KeyRecord, error) {
	return s.getKey(ctx, tx, scope, key)
}

// rowQuerier is a pool or a transaction, for statements that join either.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) getKey(ctx context.Context, db rowQuerier, scope, key string) (*idem.KeyRecord, error) {
	var rec idem.KeyRecord
	err := db.QueryRow(ctx, s.q.getKey, scope, key).Scan(recordDest(&rec)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: scope %q key %q", idem.ErrNotFound, scope, key)
	}
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: get key: %w", err))
	}
	return &rec, nil
}

// listRow is a key row plus the clock the listing was read at.
type listRow struct {
	DBNow time.Time `db:"db_now"`
	idem.KeyRecord
}

// ListKeys implements idem.Store.
func (s *Store) ListKeys(ctx context.Context, p idem.ListKeysParams) (*idem.KeyList, error) {
	return s.listKeys(ctx, s.db, p)
}

// ListKeysTx is ListKeys inside the caller's transaction.
func (s *Store) ListKeysTx(ctx context.Context, tx pgx.Tx, p idem.ListKeysParams) (*idem.KeyList, error) {
	return s.listKeys(ctx, tx, p)
}

func (s *Store) listKeys(ctx context.Context, db pgxscan.Querier, p idem.ListKeysParams) (*idem.KeyList, error) {
	if p.Limit <= 0 || p.Limit > idem.MaxKeyListLimit {
		return nil, fmt.Errorf("%w: list limit %d is outside 1-%d", idem.ErrInvalidRequest, p.Limit, idem.MaxKeyListLimit)
	}
	sql, args, err := s.q.listKeys(p)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list keys: %w", err)
	}
	var rows []*listRow
	if err := pgxscan.Select(ctx, db, &rows, sql, args...); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: list keys: %w", err))
	}
	list := &idem.KeyList{Keys: make([]*idem.KeyRecord, len(rows))}
	for i, row := range rows {
		list.Keys[i] = &row.KeyRecord
		list.Now = row.DBNow
	}
	if len(rows) == 0 {
		// No row carried the clock; read it on its own.
		var clock struct {
			T time.Time `db:"t"`
		}
		if err := pgxscan.Get(ctx, db, &clock, s.q.clock, p.Now); err != nil {
			return nil, mapError(fmt.Errorf("pgstore: read clock: %w", err))
		}
		list.Now = clock.T
	}
	return list, nil
}

// unlockRow is a key row plus whether the unlock statement changed it.
type unlockRow struct {
	Unlocked bool `db:"unlocked"`
	idem.KeyRecord
}

// UnlockKey implements idem.Store.
func (s *Store) UnlockKey(ctx context.Context, p idem.UnlockParams) (*idem.UnlockResult, error) {
	return s.unlockKey(ctx, s.db, p)
}

// UnlockKeyTx is UnlockKey inside the caller's transaction: the fence moves
// on when the caller commits, and the row stays locked against acquisitions
// until then.
func (s *Store) UnlockKeyTx(ctx context.Context, tx pgx.Tx, p idem.UnlockParams) (*idem.UnlockResult, error) {
	return s.unlockKey(ctx, tx, p)
}

func (s *Store) unlockKey(ctx context.Context, db pgxscan.Querier, p idem.UnlockParams) (*idem.UnlockResult, error) {
	var rows []*unlockRow
	if err := pgxscan.Select(ctx, db, &rows, s.q.unlockKey, p.Scope, p.Key, p.Reason); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: unlock key: %w", err))
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: scope %q key %q", idem.ErrNotFound, p.Scope, p.Key)
	}
	return &idem.UnlockResult{Record: &rows[0].KeyRecord, Unlocked: rows[0].Unlocked}, nil
}

// ClaimIdle implements idem.Store.
func (s *Store) ClaimIdle(ctx context.Context, p idem.ClaimIdleParams) ([]*idem.KeyRecord, error) {
	switch {
	case p.Status != idem.StatusRunning && p.Status != idem.StatusNeedsReconcile:
		return nil, fmt.Errorf("%w: claim idle keys in status %q", idem.ErrInvalidRequest, p.Status)
	case p.IdleFor <= 0:
		return nil, fmt.Errorf("%w: claim idle keys: IdleFor %s must be positive", idem.ErrInvalidRequest, p.IdleFor)
	case p.Limit <= 0:
		return nil, fmt.Errorf("%w: claim idle keys: Limit %d must be positive", idem.ErrInvalidRequest, p.Limit)
	case len(p.Flows) == 0:
		return nil, nil
	}
	var recs []*idem.KeyRecord
	err := pgxscan.Select(ctx, s.db, &recs, s.q.claimIdle,
		p.Now, string(p.Status), p.Flows, p.IdleFor.Microseconds(), p.MaxAttempts, p.Limit)
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: claim idle keys: %w", err))
	}
	return recs, nil
}

// Reap implements idem.Store. The batch runs in a transaction of its own so
// that the statement timeout applies to it alone.
func (s *Store) Reap(ctx context.Context, p idem.ReapParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("%w: reap: Limit %d must be positive", idem.ErrInvalidRequest, p.Limit)
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return 0, mapError(fmt.Errorf("pgstore: reap: begin: %w", err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if p.StatementTimeout > 0 {
		ms := max(p.StatementTimeout.Milliseconds(), 1)
		if _, err := tx.Exec(ctx, s.q.statementTimeout, fmt.Sprint(ms)); err != nil {
			return 0, mapError(fmt.Errorf("pgstore: reap: set statement timeout: %w", err))
		}
	}
	tag, err := tx.Exec(ctx, s.q.reap, p.Now, p.Limit)
	if err != nil {
		return 0, mapError(fmt.Errorf("pgstore: reap: %w", err))
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, mapError(fmt.Errorf("pgstore: reap: commit: %w", err))
	}
	return int(tag.RowsAffected()), nil
}

// ClassifyPhaseError implements idem.Store. Only what certainly comes from
// the database is classified: Postgres's error codes, a failed connect, and
// the phase's own connection having closed. A phase's foreign call may fail
// with network errors of its own, which are none of the store's business.
func (s *Store) ClassifyPhaseError(tx pgx.Tx, err error) error {
	if mapped, ok := mapPgError(err); ok {
		return mapped
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return fmt.Errorf("%w: %w", idem.ErrStoreUnavailable, err)
	}
	if ptx, ok := tx.(*phaseTx); ok && ptx.connectionLost() {
		return fmt.Errorf("%w: the phase's connection closed: %w", idem.ErrStoreUnavailable, err)
	}
	return err
}

// mapPgError classifies what Postgres itself said (or an error already
// classified), reporting whether it did.
func mapPgError(err error) (error, bool) {
	if err == nil {
		return nil, true
	}
	if errors.Is(err, idem.ErrStoreUnavailable) || errors.Is(err, idem.ErrSerialization) || errors.Is(err, idem.ErrInvalidRequest) {
		return err, true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err, false
	}
	switch {
	case pgErr.Code == "40001" || pgErr.Code == "40P01": // serialization_failure, deadlock_detected
		return fmt.Errorf("%w: %w", idem.ErrSerialization, err), true
	case pgErr.Code == "22P05" || pgErr.Code == "22021": // untranslatable_character, character_not_in_repertoire
		// Input Postgres cannot store (a NUL, invalid UTF-8) fails the
		// same way on every retry: it is bad input, not a failure.
		return fmt.Errorf("%w: %w", idem.ErrInvalidRequest, err), true
	case pgErr.Code[:2] == "08", // connection exception
		pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutdown, crash, starting up
		pgErr.Code == "53300", // too_many_connections
		pgErr.Code == "25006": // read_only_sql_transaction: a failover left us on a standby
		return fmt.Errorf("%w: %w", idem.ErrStoreUnavailable, err), true
	}
	return err, true // a Postgres error that is the phase's own business
}

// mapError is the one place the store's own driver errors become idem's
// sentinels.
func mapError(err error) error {
	if mapped, ok := mapPgError(err); ok {
		return mapped
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The caller gave up; the database may be fine.
		return err
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connectErr) || errors.As(err, &netErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("%w: %w", idem.ErrStoreUnavailable, err)
	}
	var connErr interface{ SafeToRetry() bool }
	if errors.As(err, &connErr) {
		return fmt.Errorf("%w: %w", idem.ErrStoreUnavailable, err)
	}
	return err
}
