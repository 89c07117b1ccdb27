// Package pgstore is idem's Postgres store, on pgx/v5.
//
// All of idem's SQL lives in this package (queries.go), but for the body of
// the acquisition function idem_acquire, which a migration creates
// (migrations/sql/0007_v02_format.up.sql). Every error that comes back
// from the driver passes through one function, mapError, which
// turns connection failures into idemtype.ErrStoreUnavailable and serialization
// failures and deadlocks into idemtype.ErrSerialization. The tables must exist:
// apply the migrations package first.
//
//	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	store, _ := pgstore.New(pool, &pgstore.Config{Schema: "idem"})
//	runner, _ := idem.NewRunner(store, nil)
//
// A running request holds one connection of the pool: its phase's
// transaction. The statements a held key sends outside it (foreign marks,
// heartbeats, releases) go through a small control pool of their own, so a
// pool full of phases never waits on itself; close it with Store.Close.
//
// Every pgx query exec mode works on a direct connection. Behind a
// connection pooler in transaction mode (PgBouncer pool_mode=transaction),
// New refuses the modes the pooler breaks (ErrPoolerExecMode): use
// default_query_exec_mode=cache_describe, exec or simple_protocol in the
// URL; see docs/operations.md, "PgBouncer".
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/migrations"
)

// Config configures a [Store].
type Config struct {
	// Schema holds idem's tables; it must match the schema the migrations
	// were applied to. Empty (the default) leaves table names unqualified,
	// so they resolve through the connection's search_path.
	Schema string

	// ControlDB carries the statements a held key makes outside its phase's
	// transaction: foreign marks, heartbeats, releases, parking a key for
	// reconcile, and re-reading a key whose commit reply was lost. They must
	// never wait for a connection of the pool the phases hold, or a full
	// pool of phases waiting on their own marks would wait forever. Default:
	// when db is a *pgxpool.Pool, New opens a pool of ControlConnsDefault
	// connections with db's configuration (close it with Store.Close);
	// otherwise db itself, and sizing it is the caller's business.
	ControlDB DB

	// Keyring, when set, seals each key's params and response body at rest
	// with its keys (AES-256-GCM, 32-byte keys), naming per row the key each
	// was sealed with, so keys rotate. Rows written in the clear are
	// refused unless its AcceptUnkeyed is set. Response headers, checkpoint
	// data, last_error and the key's metadata are not sealed (see
	// docs/operations.md, Data and retention). Default: stored in the
	// clear.
	Keyring *idemtype.Keyring

	// Instance names this process among the application's instances, with a
	// name it keeps across restarts and no live process shares: a
	// Kubernetes pod name (a StatefulSet's, or a Deployment's, which keeps
	// it across container restarts), or the host name of a host that runs
	// one process. Every lease the store takes names its holder (this
	// instance, the host, the process id and a boot id: KeyRecord.Holder*,
	// `keys show`). With Instance set, a process takes over the keys an
	// earlier process of the same instance held when it died (a crash, kill
	// -9, OOM kill) on their next request, without waiting for their
	// leases to expire: the takeover moves the fence, so a writer of the
	// old process that is somehow alive fails its next statement. Two live
	// processes with one Instance would take each other's keys on every
	// retry: never share it, not even for a moment (a restart that starts
	// the new process before the old one has drained, as zero-downtime
	// reloads do, needs a new name). Default: empty, and a dead process's leases
	// run out (Lease) before another takes its keys over.
	Instance string

	// Wait says how the store finds out that a key requests wait for is
	// done: WaitAuto (the default), WaitPoll, or WaitListen.
	Wait Wait

	// Logger receives the store's own logs: a listener that cannot LISTEN
	// (logged at warn, at most once a minute; waiting requests poll
	// meanwhile). Default: slog.Default().
	Logger *slog.Logger
}

// ControlConnsDefault is the size of the control pool New opens.
const ControlConnsDefault = 2

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

// Store implements idemdriver.Store on Postgres.
type Store struct {
	db      DB
	control DB
	// ownControl is the control pool New opened, which Close closes.
	ownControl *pgxpool.Pool
	q          *queries
	// seal seals params and response bodies (nil: stored in the clear).
	seal *sealer
	// holder is who the store's leases name as their holder.
	holder holder
	// waits are the keys this process's requests wait for (wait.go).
	waits *waits
	// habits say, per flow, which acquisition statement to send first
	// (acquire.go).
	habits acquireHabits
	// sweepLag is how long the sweep waits before moving its cursor, and
	// sweepChunk how many ids it lists at most per statement (sweep.go):
	// the constants, smaller in tests.
	sweepLag   time.Duration
	sweepChunk int64
}

var _ idemdriver.Store = (*Store)(nil)

// New returns a store on db. A nil config means the defaults.
//
// New checks the schema, within 5 seconds: it returns an error wrapping
// ErrSchema when the migrations were not applied there, the schema is
// older than this code needs, or an unreleased development build migrated
// it (migrations.ErrUnreleasedSchema), so a deploy that forgot them fails
// at start rather than on its first request. A schema ahead of this code is
// accepted: from v0.2.0 on, schema changes are expand/contract, and a
// release runs on the schema of the next one until that one contracts. New
// also finds out whether idem's tables are distributed by Citus
// (Distributed). When the database does not answer
// (it is down, or unreachable from here), the check is skipped and New
// succeeds: the runner then reports the store unavailable per request
// until it is back, and the schema is not checked again.
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
	seal, err := newSealer(config.Keyring)
	if err != nil {
		return nil, err
	}
	st := &Store{db: db, control: config.ControlDB, q: newQueries(prefix), seal: seal, holder: newHolder(config.Instance),
		sweepLag: sweepLag, sweepChunk: sweepChunk}
	st.waits = newWaits(st, db, config)
	if st.control == nil {
		st.control = db
		if pool, ok := db.(*pgxpool.Pool); ok {
			cfg := pool.Config() // a copy
			cfg.MaxConns, cfg.MinConns = ControlConnsDefault, 0
			if st.ownControl, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
				return nil, fmt.Errorf("pgstore: open the control pool: %w", err)
			}
			st.control = st.ownControl
		}
	}
	if err := st.checkSchema(config.Schema, prefix); err != nil {
		st.Close()
		return nil, err
	}
	if config.Wait.mode != waitListen || config.Wait.conn != nil {
		// Unless WaitListen said db's connections keep their session.
		ctx, cancel := context.WithTimeout(context.Background(), schemaCheckTimeout)
		defer cancel()
		// The control pool New opens has db's configuration: db's check
		// covers it.
		for _, p := range []DB{st.db, config.ControlDB} {
			if pool, ok := p.(*pgxpool.Pool); ok {
				if err := st.checkPooler(ctx, pool); err != nil {
					st.Close()
					return nil, err
				}
			}
		}
	}
	return st, nil
}

// ErrSchema is wrapped by the error New returns for a schema the migrations
// were not applied to, one older than this code, or one an unreleased
// development build migrated.
var ErrSchema = errors.New("pgstore: the idem schema is missing or out of date")

// schemaCheckTimeout bounds New's look at the schema.
const schemaCheckTimeout = 5 * time.Second

// checkSchema fails a store whose tables are missing, older than this code
// or an unreleased build's, at construction rather than on the first
// request, and finds out whether they are distributed by Citus. A database
// that does not answer is not checked: the runner reports it unavailable,
// per request, until it is back.
func (s *Store) checkSchema(schema, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), schemaCheckTimeout)
	defer cancel()
	var found bool
	err := s.control.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, prefix+"idem_migrations").Scan(&found)
	if err != nil {
		// No answer to go on: the runner reports the store per request.
		return nil
	}
	if !found {
		return fmt.Errorf("%w: %sidem_migrations does not exist; apply the migrations first ((*migrations.Migrator).Up, or `idem migrate up`)", ErrSchema, prefix)
	}
	m, err := migrations.New(s.control, &migrations.Config{Schema: schema})
	if err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	version, err := m.Version(ctx)
	if errors.Is(err, migrations.ErrUnreleasedSchema) {
		return fmt.Errorf("%w: %w", ErrSchema, err)
	}
	if err != nil {
		return fmt.Errorf("pgstore: read the schema version: %w", err)
	}
	if version < migrations.Latest() {
		return fmt.Errorf("%w: the schema is at version %d and this code needs %d; run the migrations (`idem migrate up`)", ErrSchema, version, migrations.Latest())
	}
	distributed, err := m.Distributed(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: find out whether idem_keys is distributed by Citus: %w", err)
	}
	if distributed {
		s.useCitus()
	}
	return nil
}

// Close closes the control pool New opened, if it did, and the connection
// that LISTENs for the keys requests wait for; it wakes every request that
// waits for a key (each acquires it again, and gets what the store then
// answers), and returns once the store's goroutines have ended. A key
// watched after Close is woken at once. It does not close the db the store
// was given.
func (s *Store) Close() {
	if s.waits != nil {
		s.waits.close()
	}
	if s.ownControl != nil {
		s.ownControl.Close()
	}
}

// DB returns the handle the store runs on.
func (s *Store) DB() DB { return s.db }

// maxAcquireStatements bounds the calls of the acquisition (idem_acquire). A
// second call is needed only when a concurrent acquirer inserted, replaced or
// deleted the key in a way the first call's snapshots could not see (see
// queries.acquire), which the next call's snapshot does.
const maxAcquireStatements = 4

// Acquire implements idemdriver.Store.
func (s *Store) Acquire(ctx context.Context, p idemdriver.AcquireParams) (*idemdriver.AcquireResult, error) {
	args, err := s.acquireArgs(p)
	if err != nil {
		return nil, err
	}
	res, sent, err := s.acquireInPlainSQL(ctx, p, args)
	if err != nil {
		return nil, err
	}
	switch {
	case res != nil && res.Record == nil:
		return res, nil // NoCreate found nothing live
	case res != nil:
		return s.takeOverIfAbandoned(ctx, p, res)
	}
	for i := sent; i < maxAcquireStatements+sent; i++ {
		res, err := s.acquisition(ctx, s.db, s.q.acquire, args...)
		if errors.Is(err, pgx.ErrNoRows) {
			if p.NoCreate {
				// No live key; whatever a concurrent insert did, the
				// caller's next acquisition (creating) sees it.
				return &idemdriver.AcquireResult{Acquired: idemdriver.AcquiredNone, Retried: i}, nil
			}
			continue
		}
		if err != nil {
			if err = acquireError(err); errors.Is(err, idemtype.ErrSerialization) {
				continue
			}
			return nil, err
		}
		res.Retried = i
		return s.takeOverIfAbandoned(ctx, p, res)
	}
	return nil, fmt.Errorf("pgstore: acquire: key %q kept appearing and disappearing under concurrent writers", p.Key)
}

// acquireError is err, an acquisition statement's failure, classified.
// Under a server default of repeatable read or serializable, a concurrent
// insert of the same key that the statement's snapshot cannot see is a
// serialization failure (ErrSerialization), not a conflict: the caller
// calls again, and the next snapshot sees it.
func acquireError(err error) error {
	return mapError(fmt.Errorf("pgstore: acquire: %w", err))
}

// acquireArgs are the arguments of the acquire statement for p.
func (s *Store) acquireArgs(p idemdriver.AcquireParams) ([]any, error) {
	params, paramsKeyID, err := s.sealParams(p)
	if err != nil {
		return nil, err
	}
	return append(append([]any{
		p.Now, p.Scope, p.Key, p.Flow, p.Method, p.Path, first(p.Fingerprints), string(params), p.Lease.Microseconds(), p.NoCreate, paramsKeyID},
		s.holder.args()...), p.Retention.Microseconds()), nil
}

// takeOverIfAbandoned takes over the unfinished key the acquisition res
// found, when nobody holds it (or an earlier process of this instance, now
// dead, does) and it is this request; otherwise it returns res.
func (s *Store) takeOverIfAbandoned(ctx context.Context, p idemdriver.AcquireParams, res *idemdriver.AcquireResult) (*idemdriver.AcquireResult, error) {
	rec := res.Record
	if res.Acquired != idemdriver.AcquiredNone || rec.Status != idemtype.StoredRunning ||
		rec.Flow != p.Flow || !rec.SameRequest(p.Fingerprints) || rec.Method != p.Method || rec.Path != p.Path ||
		(rec.Locked(res.DBNow) && !s.holder.resumes(rec)) {
		return res, nil
	}
	taken, err := s.acquisition(ctx, s.db, s.q.takeOver, append(append([]any{
		p.Now, rec.ID, p.Flow, rec.Fingerprint, p.Lease.Microseconds(), p.Method, p.Path}, s.holder.args()...), rec.Scope)...)
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.Is(mapError(err), idemtype.ErrSerialization):
		// Another worker took it (or finished it) first; report the row as
		// it was, which reads as in progress.
		return res, nil
	case errors.Is(err, ErrCannotOpen):
		// The row was opened a statement ago; still, never hold a key the
		// runner is told nothing about.
		s.letGo(ctx, taken.Record, s.q.release, err)
		return nil, err
	case err != nil:
		return nil, mapError(fmt.Errorf("pgstore: take over: %w", err))
	}
	taken.Retried = res.Retried
	return taken, nil
}

// acquisition runs a statement that returns (acquired, db_now, key
// columns) and scans its one row; pgx.ErrNoRows when there is none. A plan a
// migration invalidated (planChanged) is run once more. When the
// row's sealed values cannot be opened it returns the row as scanned with
// the ErrCannotOpen error, so that a caller that locked it can let it go.
func (s *Store) acquisition(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) (*idemdriver.AcquireResult, error) {
	res := &idemdriver.AcquireResult{Record: &idemtype.KeyRecord{}}
	dest := append([]any{&res.Acquired, &res.DBNow}, recordDest(res.Record)...)
	err := db.QueryRow(ctx, sql, args...).Scan(dest...)
	if planChanged(err) {
		// A migration changed what the statement returns since this
		// connection prepared it; pgx has forgotten the statement, and
		// the failed call did nothing. Once more, on a fresh plan.
		err = db.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	if err != nil {
		return nil, err
	}
	if err := s.open(res.Record); err != nil {
		return res, err
	}
	return res, nil
}

// letGo unlocks a key the store locked (a takeover, a reconcile claim) but
// could not open, with unlock (release or setNeedsReconcile, which keep its
// status), recording why. Should it fail, the lease expires.
func (s *Store) letGo(ctx context.Context, rec *idemtype.KeyRecord, unlock string, why error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), beginTimeout)
	defer cancel()
	_, _ = s.control.Exec(ctx, unlock, rec.ID, rec.Fence, why.Error(), rec.Scope)
}

// ClaimReconcile implements idemdriver.Store.
func (s *Store) ClaimReconcile(ctx context.Context, p idemdriver.ClaimParams) (*idemdriver.AcquireResult, error) {
	res, err := s.acquisition(ctx, s.db, s.q.claimReconcile, append([]any{p.Now, p.Scope, p.Key, p.Lease.Microseconds()}, s.holder.args()...)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return &idemdriver.AcquireResult{Acquired: idemdriver.AcquiredNone}, nil
	}
	if errors.Is(err, ErrCannotOpen) {
		if res.Acquired == idemdriver.AcquiredTakenOver {
			s.letGo(ctx, res.Record, s.q.setNeedsReconcile, err)
		}
		return nil, err
	}
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: claim for reconcile: %w", err))
	}
	return res, nil
}

// BeginPhase implements idemdriver.Store.
//
// The transaction it returns sends BEGIN together with the phase's first
// statement and its guarded commit in one round trip (see phaseTx), so a
// phase costs one round trip beyond its own statements.
func (s *Store) BeginPhase(ctx context.Context, opts idemdriver.PhaseOptions) (idemdriver.PhaseTx, error) {
	return s.beginPhase(ctx, opts)
}

func (s *Store) beginPhase(ctx context.Context, opts idemdriver.PhaseOptions) (*phaseTx, error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: begin phase: %w", err))
	}
	return &phaseTx{conn: conn, opts: pgx.TxOptions{IsoLevel: opts.Isolation}, q: s.q, seal: s.seal, stmtTimeout: opts.StatementTimeout}, nil
}

// Heartbeat implements idemdriver.Store.
func (s *Store) Heartbeat(ctx context.Context, ref idemdriver.LockRef, lease time.Duration, now *time.Time) (time.Time, error) {
	var expires time.Time
	err := s.control.QueryRow(ctx, s.q.heartbeat, ref.ID, ref.Fence, lease.Microseconds(), now, ref.Scope).Scan(&expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("%w: heartbeat found fence %d of key %d gone", idemtype.ErrLockLost, ref.Fence, ref.ID)
	}
	if err != nil {
		return time.Time{}, mapError(fmt.Errorf("pgstore: heartbeat: %w", err))
	}
	return expires, nil
}

// Release implements idemdriver.Store.
func (s *Store) Release(ctx context.Context, ref idemdriver.LockRef, lastError string) error {
	return s.guarded(ctx, "release", ref, true, s.q.release, ref.ID, ref.Fence, lastError, ref.Scope)
}

// MarkForeign implements idemdriver.Store.
func (s *Store) MarkForeign(ctx context.Context, ref idemdriver.LockRef, phase string) error {
	return s.guarded(ctx, "mark foreign call", ref, false, s.q.markForeign, ref.ID, ref.Fence, phase, ref.Scope)
}

// ClearForeignMark implements idemdriver.Store.
func (s *Store) ClearForeignMark(ctx context.Context, ref idemdriver.LockRef) error {
	return s.guarded(ctx, "clear foreign mark", ref, false, s.q.clearForeignMark, ref.ID, ref.Fence, ref.Scope)
}

// SetNeedsReconcile implements idemdriver.Store.
func (s *Store) SetNeedsReconcile(ctx context.Context, ref idemdriver.LockRef, reason string) error {
	return s.guarded(ctx, "set needs_reconcile", ref, true, s.q.setNeedsReconcile, ref.ID, ref.Fence, reason, ref.Scope)
}

// guardedAttempts bounds the tries of a guarded statement that meets a
// serialization failure, which it can only under a server default of
// repeatable read or serializable, when a heartbeat of the same key commits
// between the statement's snapshot and its row lock. Each is one statement
// that either happened or did not, so running it again is safe.
const guardedAttempts = 3

// guarded runs one of the statements a held key sends outside its phase's
// transaction, on the control pool. counted statements return the number of
// keys their guard matched; the others report it as rows affected.
func (s *Store) guarded(ctx context.Context, what string, ref idemdriver.LockRef, counted bool, sql string, args ...any) error {
	var err error
	for range guardedAttempts {
		var matched int64
		if counted {
			err = s.control.QueryRow(ctx, sql, args...).Scan(&matched)
		} else {
			var tag pgconn.CommandTag
			tag, err = s.control.Exec(ctx, sql, args...)
			matched = tag.RowsAffected()
		}
		if err == nil && matched == 0 {
			return fmt.Errorf("%w: %s: fence %d of key %d moved on", idemtype.ErrLockLost, what, ref.Fence, ref.ID)
		}
		if err == nil {
			return nil
		}
		if err = mapError(fmt.Errorf("pgstore: %s: %w", what, err)); !errors.Is(err, idemtype.ErrSerialization) {
			return err
		}
	}
	return err
}

// GetKey implements idemdriver.Store.
func (s *Store) GetKey(ctx context.Context, scope, key string) (*idemtype.KeyRecord, error) {
	// The control pool: the runner re-reads a key through it while a full
	// phase pool may be waiting on it.
	return s.getKey(ctx, s.control, scope, key)
}

// rowQuerier is a pool or a transaction, for statements that join either.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) getKey(ctx context.Context, db rowQuerier, scope, key string) (*idemtype.KeyRecord, error) {
	var rec idemtype.KeyRecord
	err := db.QueryRow(ctx, s.q.getKey, scope, key).Scan(recordDest(&rec)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: scope %q key %q", idemtype.ErrNotFound, scope, key)
	}
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: get key: %w", err))
	}
	if err := s.open(&rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// listRow is a key row plus the clock the listing was read at.
type listRow struct {
	DBNow time.Time `db:"db_now"`
	idemtype.KeyRecord
}

// ListKeys implements idemdriver.Store.
func (s *Store) ListKeys(ctx context.Context, p idemdriver.ListKeysParams) (*idemtype.KeyList, error) {
	return s.listKeys(ctx, s.db, p)
}

func (s *Store) listKeys(ctx context.Context, db pgxscan.Querier, p idemdriver.ListKeysParams) (*idemtype.KeyList, error) {
	if p.Limit <= 0 || p.Limit > idemtype.MaxKeyListLimit {
		return nil, fmt.Errorf("%w: list limit %d is outside 1-%d", idemtype.ErrInvalidRequest, p.Limit, idemtype.MaxKeyListLimit)
	}
	var window *unfinishedWindow
	if st := p.State; st == idemtype.KeyStateRunning || st == idemtype.KeyStateStale || st == idemtype.KeyStateNeedsReconcile {
		w, err := s.unfinished(ctx)
		if err != nil {
			return nil, fmt.Errorf("pgstore: list keys: %w", err)
		}
		window = &w
	}
	sql, args, err := s.q.listKeys(p, window)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list keys: %w", err)
	}
	var rows []*listRow
	if err := selectAll(ctx, db, &rows, sql, args...); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: list keys: %w", err))
	}
	list := &idemtype.KeyList{Keys: make([]*idemtype.KeyRecord, len(rows))}
	for i, row := range rows {
		if !p.Reveal {
			withoutPayload(&row.KeyRecord)
		} else if err := s.open(&row.KeyRecord); err != nil {
			return nil, fmt.Errorf("pgstore: list keys: %w", err)
		}
		list.Keys[i] = &row.KeyRecord
		list.Now = row.DBNow
	}
	if len(rows) == 0 {
		// No row carried the clock; read it on its own.
		var clock []struct {
			T time.Time `db:"t"`
		}
		if err := selectAll(ctx, db, &clock, s.q.clock, p.Now); err != nil {
			return nil, mapError(fmt.Errorf("pgstore: read clock: %w", err))
		}
		list.Now = clock[0].T
	}
	return list, nil
}

// withoutPayload empties what a listing shows only when asked to reveal it:
// the input, the checkpoint data and the response's headers and body.
func withoutPayload(rec *idemtype.KeyRecord) {
	rec.Params, rec.Checkpoint, rec.ResponseHeaders, rec.ResponseBody = nil, nil, nil, nil
}

// unlockRow is a key row plus whether the unlock statement changed it.
type unlockRow struct {
	Unlocked bool `db:"unlocked"`
	idemtype.KeyRecord
}

// UnlockKey implements idemdriver.Store.
func (s *Store) UnlockKey(ctx context.Context, p idemdriver.UnlockParams) (*idemtype.UnlockResult, error) {
	return s.unlockKey(ctx, s.db, p)
}

func (s *Store) unlockKey(ctx context.Context, db pgxscan.Querier, p idemdriver.UnlockParams) (*idemtype.UnlockResult, error) {
	var rows []*unlockRow
	if err := selectAll(ctx, db, &rows, s.q.unlockKey, p.Scope, p.Key, p.Reason); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: unlock key: %w", err))
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: scope %q key %q", idemtype.ErrNotFound, p.Scope, p.Key)
	}
	// An operator unlocks a key without the keyring: the result carries
	// no payload.
	withoutPayload(&rows[0].KeyRecord)
	return &idemtype.UnlockResult{Record: &rows[0].KeyRecord, Unlocked: rows[0].Unlocked}, nil
}

// ClaimIdle implements idemdriver.Store.
func (s *Store) ClaimIdle(ctx context.Context, p idemdriver.ClaimIdleParams) ([]*idemtype.KeyRecord, error) {
	switch {
	case p.Status != idemtype.StoredRunning && p.Status != idemtype.StoredNeedsReconcile:
		return nil, fmt.Errorf("%w: claim idle keys in status %q", idemtype.ErrInvalidRequest, p.Status)
	case p.IdleFor <= 0:
		return nil, fmt.Errorf("%w: claim idle keys: IdleFor %s must be positive", idemtype.ErrInvalidRequest, p.IdleFor)
	case p.Limit <= 0:
		return nil, fmt.Errorf("%w: claim idle keys: Limit %d must be positive", idemtype.ErrInvalidRequest, p.Limit)
	case len(p.Flows) == 0:
		return nil, nil
	}
	w, err := s.unfinished(ctx)
	if err != nil {
		return nil, err
	}
	if s.q.citus {
		return s.claimIdleCitus(ctx, p, w)
	}
	var recs []*idemtype.KeyRecord
	err = selectAll(ctx, s.db, &recs, s.q.claimIdle, append([]any{
		p.Now, string(p.Status), p.Flows, p.IdleFor.Microseconds(), p.MaxAttempts, p.Limit, s.holder.instance, s.holder.boot},
		w.args()...)...)
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: claim idle keys: %w", err))
	}
	// Claims carry no payload: whoever runs a key reads it (and opens what
	// is sealed) then, so one key that cannot be opened fails alone.
	for _, rec := range recs {
		withoutPayload(rec)
	}
	return recs, nil
}

// Reap implements idemdriver.Store. The batch runs in a transaction of its own so
// that the statement timeout applies to it alone.
func (s *Store) Reap(ctx context.Context, p idemdriver.ReapParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("%w: reap: Limit %d must be positive", idemtype.ErrInvalidRequest, p.Limit)
	}
	if s.q.citus {
		return s.reapCitus(ctx, p)
	}
	return s.deleteBatch(ctx, "reap", p.StatementTimeout, s.q.reap, p.Now, p.Limit)
}

// ReapUnfinished implements idemdriver.Store, as Reap does.
func (s *Store) ReapUnfinished(ctx context.Context, p idemdriver.ReapUnfinishedParams) (idemdriver.ReapUnfinishedResult, error) {
	if p.Limit <= 0 {
		return idemdriver.ReapUnfinishedResult{}, fmt.Errorf("%w: reap unfinished keys: Limit %d must be positive", idemtype.ErrInvalidRequest, p.Limit)
	}
	// Ages travel in microseconds; a negative one (never) stays negative
	// however short it is.
	micros := func(d time.Duration) int64 {
		if d < 0 {
			return -1
		}
		return d.Microseconds()
	}
	flows, ages := make([]string, 0, len(p.FlowAfter)), make([]int64, 0, len(p.FlowAfter))
	for flow, age := range p.FlowAfter {
		flows, ages = append(flows, flow), append(ages, micros(age))
	}
	w, err := s.unfinished(ctx)
	if err != nil {
		return idemdriver.ReapUnfinishedResult{}, err
	}
	args := append([]any{p.Now, micros(p.After), flows, ages, p.Limit}, w.args()...)
	if s.q.citus {
		return s.reapAbandonedCitus(ctx, p, args)
	}
	var res idemdriver.ReapUnfinishedResult
	err = s.inBatchTx(ctx, "reap unfinished keys", p.StatementTimeout, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.q.leaseRowsAbandoned, args...); err != nil {
			return err
		}
		return tx.QueryRow(ctx, s.q.reapAbandoned, args...).Scan(&res.Deleted, &res.NeedsReconcile)
	})
	if err != nil {
		return idemdriver.ReapUnfinishedResult{}, err
	}
	return res, nil
}

// UnfinishedKeys implements idemdriver.Store.
func (s *Store) UnfinishedKeys(ctx context.Context, flows []string) ([]idemdriver.UnfinishedKeys, error) {
	if len(flows) == 0 {
		return nil, nil
	}
	w, err := s.unfinished(ctx)
	if err != nil {
		return nil, err
	}
	var groups []idemdriver.UnfinishedKeys
	if err := selectAll(ctx, s.db, &groups, s.q.unfinishedKeys, append([]any{flows}, w.args()...)...); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: unfinished keys: %w", err))
	}
	return groups, nil
}

// deleteBatch runs one batch's DELETE in a transaction of its own, under its
// statement timeout, and returns the rows it deleted.
func (s *Store) deleteBatch(ctx context.Context, what string, timeout time.Duration, sql string, args ...any) (int, error) {
	var deleted int
	err := s.inBatchTx(ctx, what, timeout, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, args...)
		deleted = int(tag.RowsAffected())
		return err
	})
	return deleted, err
}

// inBatchTx runs one batch's statement, run, in a transaction of its own,
// under its statement timeout.
func (s *Store) inBatchTx(ctx context.Context, what string, timeout time.Duration, run func(pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return mapError(fmt.Errorf("pgstore: %s: begin: %w", what, err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if timeout > 0 {
		ms := max(timeout.Milliseconds(), 1)
		if _, err := tx.Exec(ctx, s.q.localStatementTimeout, fmt.Sprint(ms)); err != nil {
			return mapError(fmt.Errorf("pgstore: %s: set statement timeout: %w", what, err))
		}
	}
	if err := run(tx); err != nil {
		return mapError(fmt.Errorf("pgstore: %s: %w", what, err))
	}
	if err := tx.Commit(ctx); err != nil {
		return mapError(fmt.Errorf("pgstore: %s: commit: %w", what, err))
	}
	return nil
}

// planChanged reports whether err is Postgres refusing to run a prepared
// statement whose result type changed under it (SQLSTATE 0A000, "cached
// plan must not change result type"): a migration replaced something the
// statement reads.
func planChanged(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "0A000" && strings.Contains(pgErr.Message, "cached plan")
}

// mapPgError classifies what Postgres itself said (or an error already
// classified), reporting whether it did.
func mapPgError(err error) (error, bool) {
	if err == nil {
		return nil, true
	}
	if errors.Is(err, idemtype.ErrStoreUnavailable) || errors.Is(err, idemtype.ErrSerialization) || errors.Is(err, idemtype.ErrInvalidRequest) {
		return err, true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err, false
	}
	switch {
	case pgErr.Code == "40001" || pgErr.Code == "40P01": // serialization_failure, deadlock_detected
		return fmt.Errorf("%w: %w", idemtype.ErrSerialization, err), true
	case pgErr.Code == "22P05" || pgErr.Code == "22021": // untranslatable_character, character_not_in_repertoire
		// Input Postgres cannot store (a NUL, invalid UTF-8) fails the
		// same way on every retry: it is bad input, not a failure.
		return fmt.Errorf("%w: %w", idemtype.ErrInvalidRequest, err), true
	case strings.HasPrefix(pgErr.Code, "08"), // connection exception
		pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutdown, crash, starting up
		pgErr.Code == "53300", // too_many_connections
		pgErr.Code == "25006": // read_only_sql_transaction: a failover left us on a standby
		return fmt.Errorf("%w: %w", idemtype.ErrStoreUnavailable, err), true
	}
	return err, true // a Postgres error that is the phase's own business
}

// mapError is the one place the store's own driver errors become idem's
// sentinels.
func mapError(err error) error {
	if mapped, ok := mapPgError(err); ok {
		return mapped
	}
	if errors.Is(err, context.Canceled) {
		// The caller gave up; the database may be fine.
		return err
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		// No connection could be made in time (a connect_timeout is a
		// context deadline too): the store is away.
		return fmt.Errorf("%w: %w", idemtype.ErrStoreUnavailable, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// A deadline ended the statement; whose it was, the caller knows.
		return err
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("%w: %w", idemtype.ErrStoreUnavailable, err)
	}
	var connErr interface{ SafeToRetry() bool }
	if errors.As(err, &connErr) {
		return fmt.Errorf("%w: %w", idemtype.ErrStoreUnavailable, err)
	}
	return err
}

// selectAll runs sql and scans every row into dst, a pointer to a slice of
// structs, as pgxscan.Select does; but an error of the query itself (no
// connection, a server error) is returned as pgx reports it ("failed to
// connect to ...: connection refused"), not inside scany's "scany: query
// multiple result rows: ...", which reads like a fault of the statement.
func selectAll(ctx context.Context, db pgxscan.Querier, dst any, sql string, args ...any) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	if err := pgxscan.ScanAll(dst, rows); err != nil {
		if rerr := rows.Err(); rerr != nil {
			return rerr // the server's error, met while reading the rows
		}
		return err
	}
	return nil
}
