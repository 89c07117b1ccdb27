package idemdriver

import (
	"context"
	"encoding/json"
	"time"

	"github.com/go-idem/idem/idemtype"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Store is the persistence contract the runner is written against, in the
// spirit of database/sql/driver: the runner holds the state machine, a store
// holds the SQL. [github.com/go-idem/idem/pgstore] is the implementation;
// applications construct one and hand it to idem.NewRunner without calling
// these methods themselves.
//
// Every method that changes a locked key is guarded by a [LockRef]: it
// matches no row, and returns ErrLockLost, once the fence has moved on.
// Implementations map driver errors to ErrStoreUnavailable and
// ErrSerialization where they apply (see PhaseTx.ClassifyError).
type Store interface {
	// Acquire inserts the key locked, or takes over an existing unfinished
	// key with the same flow, fingerprint, method and path whose lease has
	// expired or that is unlocked, or reports the row as it is, in one
	// statement. A finished key is reported without its Params and
	// Checkpoint (see AcquireResult.Record). A finished key past its expiry
	// is absent: it is replaced, atomically, never reported.
	Acquire(ctx context.Context, p AcquireParams) (*AcquireResult, error)

	// ClaimReconcile locks a key in StoredNeedsReconcile for a reconcile run,
	// with a new fence. Acquired is AcquiredNone (and Record the row as it is)
	// when the key does not need reconciling or another worker holds it.
	ClaimReconcile(ctx context.Context, p ClaimParams) (*AcquireResult, error)

	// BeginPhase starts a phase's transaction. The store owns it: the runner
	// hands its statement methods to the phase (as idem.Tx) and ends it with
	// PhaseTx.CommitPhase or PhaseTx.RollbackPhase.
	BeginPhase(ctx context.Context, opts PhaseOptions) (PhaseTx, error)

	// Heartbeat extends a held lease and returns its new expiry. It is the
	// only statement that renews a lease: a phase commit does not. It must
	// not write what CommitPhase writes, or a phase at repeatable read or
	// serializable that outlives a heartbeat could never commit.
	Heartbeat(ctx context.Context, ref LockRef, lease time.Duration, now *time.Time) (time.Time, error)

	// Release unlocks a key after a failed attempt, recording the error.
	Release(ctx context.Context, ref LockRef, lastError string) error

	// MarkForeign durably records, outside the phase's transaction, that the
	// phase is about to make a not-idempotent foreign call. The mark stands
	// (KeyRecord.ForeignMark names the phase) while the key is unfinished
	// and its recovery point is still the one it was made at: the phase's
	// own commit, which moves the recovery point, retires it without
	// writing what heartbeats write, so the commit does not conflict with
	// them at repeatable read or serializable.
	MarkForeign(ctx context.Context, ref LockRef, phase string) error

	// ClearForeignMark withdraws the mark of a call known not to have
	// happened (a reconcile verdict of not happened), which no commit retires
	// because the recovery point does not move.
	ClearForeignMark(ctx context.Context, ref LockRef) error

	// SetNeedsReconcile moves a held key to StoredNeedsReconcile and unlocks it.
	SetNeedsReconcile(ctx context.Context, ref LockRef, reason string) error

	// GetKey returns one key, or ErrNotFound.
	GetKey(ctx context.Context, scope, key string) (*idemtype.KeyRecord, error)

	// WatchKey returns a channel that is closed when the attempt w watches
	// may be over: it finished, failed and released the key, was parked for
	// reconcile or taken over, or its lease ran out. The runner then
	// acquires the key again, which replays it, reports it parked or in
	// progress, or takes it over. stop must be called when the caller stops
	// waiting. The store owns the one loop that finds out, for every waiter
	// of the process: however many wait, each watched key costs one check
	// per tick of that loop (woken sooner by notifications where they
	// work), never one per waiter.
	WatchKey(ctx context.Context, w Watch) (woken <-chan struct{}, stop func())

	OperationsStore
	VerdictStore
}

// PhaseOptions configure a phase's transaction.
type PhaseOptions struct {
	// Isolation is the transaction's isolation level.
	Isolation pgx.TxIsoLevel
	// StatementTimeout bounds each statement the phase sends through the
	// transaction (its context gets this deadline); zero means no bound.
	StatementTimeout time.Duration
}

// PhaseTx is a phase's transaction as the store owns it. Its statement
// methods are the shape sqlc-generated code takes (DBTX); they are all a
// phase ever sees, as idem.Tx. Only the runner ends the transaction, with
// CommitPhase or Rollback.
type PhaseTx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)

	// CommitPhase records the phase's outcome on the key, guarded by the
	// fence, and commits, atomically. When the fence has moved on it rolls
	// back and returns ErrLockLost. After it returns, with or without an
	// error, the transaction is over. What it writes must be written, while
	// the key is held, by nothing but statements that move the fence, so
	// that at repeatable read and serializable it conflicts with those
	// alone: not by heartbeats, foreign marks or their clearing.
	CommitPhase(ctx context.Context, p CommitParams) error

	// RollbackPhase ends the transaction without committing. It is a no-op
	// on a transaction that is already over. (It is not named Rollback, so
	// the value a phase gets as idem.Tx does not look like a pgx.Tx.)
	RollbackPhase(ctx context.Context) error

	// PgxTx returns the transaction as a pgx.Tx for libraries whose API
	// takes one (River's InsertTx): its statements go to the phase's
	// transaction, Begin makes a savepoint, and Commit and Rollback do
	// nothing and return ErrPhaseOwnsTx.
	PgxTx() pgx.Tx

	// ClassifyError classifies the error a phase ended with, while the
	// transaction is still open: it wraps ErrSerialization for
	// serialization failures and deadlocks, ErrStoreUnavailable when the
	// database went away under the phase (its connection is gone, or the
	// server said so), and ErrInvalidRequest for input the database cannot
	// store, and returns any other error unchanged. A network error from a
	// foreign call is not the store's: it stays a phase failure.
	ClassifyError(err error) error
}

// LockRef identifies a held lock: the key row and the fence it was acquired
// with, and the key's scope, which a store whose keys are distributed by
// scope (pgstore on Citus) needs to find the row on one node.
type LockRef struct {
	ID    int64
	Fence int64
	Scope string
}

// Acquisition says what [Store.Acquire] did.
type Acquisition string

const (
	// AcquiredCreated: the key was new; it is inserted and locked.
	AcquiredCreated Acquisition = "created"
	// AcquiredTakenOver: an unfinished, unlocked or stale key was locked
	// with a new fence.
	AcquiredTakenOver Acquisition = "taken_over"
	// AcquiredNone: nothing was locked; Record is the row as it stands.
	AcquiredNone Acquisition = "none"
)

// AcquireParams are the inputs of [Store.Acquire].
type AcquireParams struct {
	Scope, Key, Flow, Method, Path string
	// Fingerprints are the request's fingerprint under the current
	// fingerprint key, which a new key stores as KeyRecord.Fingerprint,
	// then under the keys used before it (the other keys
	// of idem.Config.FingerprintKeys): an existing key is this request when its
	// fingerprint is any of them (KeyRecord.SameRequest), and a store takes
	// it over by the fingerprint it has. One acquisition serves a rotation.
	Fingerprints [][]byte
	Params       []byte
	Lease        time.Duration
	// Retention is the flow's retention (CommitParams.Retention): a new
	// key's reap_after, the earliest it can expire, is its creation plus
	// Retention. A store's reaper looks for expired keys by it (an index the
	// finish does not write unless its retention is shorter); a key that
	// expires later, because it finished late or its flow's retention
	// grew, is re-checked and kept.
	Retention time.Duration
	// NoCreate reports or takes over an existing key as usual, but inserts
	// nothing when there is none (or only an expired one, which is then
	// left as it is): Acquired is AcquiredNone and Record nil.
	NoCreate bool
	// Now overrides the database clock (tests); nil uses now().
	Now *time.Time
}

// ClaimParams are the inputs of [Store.ClaimReconcile].
type ClaimParams struct {
	Scope, Key string
	Lease      time.Duration
	Now        *time.Time
}

// AcquireResult is what [Store.Acquire] found or made.
type AcquireResult struct {
	Acquired Acquisition
	// Record is the key as created, taken over or found. A finished key's
	// record comes without its Params and Checkpoint (nil), which a replay
	// does not use: an acquisition does not read or decode them. GetKey
	// returns them.
	Record *idemtype.KeyRecord
	// DBNow is the clock the statement used, for lease arithmetic that does
	// not depend on the application host's clock.
	DBNow time.Time
	// Retried counts extra statements needed because a concurrent insert was
	// invisible to the first one's snapshot (rare).
	Retried int
}

// CommitParams describe what a committing phase records on its key.
type CommitParams struct {
	Ref LockRef
	// RecoveryPoint becomes the key's recovery point: the phase's name when
	// it advances, RecoveryPointFinished when it responds
	// (RecoveryPointAbandoned when an operator abandoned the request; empty
	// means RecoveryPointFinished for a finishing commit).
	RecoveryPoint string
	// Status is the key's status after the commit: StoredRunning for a
	// phase that advances, StoredFinished (with Response) for one that
	// responds.
	Status idemtype.StoredStatus
	// CheckpointPatch is merged into the key's checkpoint data.
	CheckpointPatch map[string]json.RawMessage
	// Response is stored when Status is StoredFinished.
	Response *idemtype.Response
	// Retention sets expires_at of a key that finishes.
	Retention time.Duration
	// LastError is recorded as the key's last error by a commit that
	// finishes it (an operator's resolution says who and why); empty clears
	// it, as every phase that responds does.
	LastError string
	// ClearForeignMark withdraws the key's foreign mark in the commit,
	// under its fence, with StoredRunning: an operator's verdict that the
	// call in doubt did not happen leaves the recovery point where it is,
	// so the commit does not retire the mark, and the mark must go if and
	// only if the verdict (and its record) lands. It writes the lease row,
	// which heartbeats write: only for a commit no heartbeat runs beside.
	ClearForeignMark bool
	// Flow and Generation are the key's (KeyRecord.Flow, Generation): a
	// store that seals the response binds it to them.
	Flow       string
	Generation int
	Now        *time.Time
}

// OperationsStore is the part of [Store] the operations services stand on:
// listing and force-unlocking keys for operators, claiming idle keys for the
// completer and reconcile runs, and reaping expired ones. It is embedded in
// Store; it is a separate interface only so its contract reads in one place.
type OperationsStore interface {
	// ListKeys returns the keys matching p, newest (highest id) first.
	ListKeys(ctx context.Context, p ListKeysParams) (*idemtype.KeyList, error)

	// UnlockKey force-unlocks an unfinished key and moves its fence on, so
	// a worker that still believes it holds the key can no longer commit,
	// heartbeat or release. A finished key is returned unchanged with
	// Unlocked false. The record carries no payload. ErrNotFound when there
	// is no such key.
	UnlockKey(ctx context.Context, p UnlockParams) (*idemtype.UnlockResult, error)

	// ClaimIdle picks up to p.Limit keys in p.Status that nobody holds and
	// that have not run for p.IdleFor, and marks them as just run, so that
	// concurrent callers (other application instances) claim disjoint sets.
	// It does not lock the keys: the caller acquires each one through the
	// runner, which arbitrates with any client retry by the fence. The
	// records carry no payload (Params, Checkpoint, response headers and
	// body): the caller reads the keys it runs. A store that knows its
	// process's predecessors (pgstore.Config.Instance) also claims, at once,
	// the keys a dead predecessor held, idle or not. A store that claims in
	// several statements returns, with its error, the keys it claimed
	// before it: they are marked as just run and would otherwise wait
	// IdleFor again.
	ClaimIdle(ctx context.Context, p ClaimIdleParams) ([]*idemtype.KeyRecord, error)

	// Reap deletes one batch of at most p.Limit finished keys whose
	// expires_at has passed, and returns how many it deleted. It never
	// deletes an unfinished key, skips rows other transactions have locked,
	// and runs under p.StatementTimeout.
	Reap(ctx context.Context, p ReapParams) (int, error)

	// ReapUnfinished ends one batch of at most p.Limit keys in
	// StoredRunning created longer ago than their flow's UnfinishedRetention:
	// it deletes them, except that a key whose foreign mark stands (a
	// not-idempotent call in doubt) is moved to StoredNeedsReconcile
	// instead, never deleted. It never touches a key a live lease holds or
	// one in StoredNeedsReconcile, skips rows other transactions have
	// locked, and runs under p.StatementTimeout.
	ReapUnfinished(ctx context.Context, p ReapUnfinishedParams) (ReapUnfinishedResult, error)

	// Backlog counts the unfinished keys by status, with the creation time
	// of the oldest in each, reading only unfinished rows. It reports
	// StoredRunning and StoredNeedsReconcile, each even when it has no key.
	Backlog(ctx context.Context, p BacklogParams) (*idemtype.Backlog, error)

	// UnfinishedKeys counts the unfinished keys of the given flows by flow,
	// recovery point, standing foreign mark (a not-idempotent call in
	// doubt; empty when none stands) and status, reading only unfinished
	// rows. Empty flows counts nothing. A binary checks at start whether it
	// can resume and reconcile them (Runner.CheckResumable,
	// Runner.CheckReconcileHooks).
	UnfinishedKeys(ctx context.Context, flows []string) ([]UnfinishedKeys, error)
}

// UnfinishedKeys is one group of [OperationsStore.UnfinishedKeys]: Keys
// unfinished keys of Flow in Status at RecoveryPoint, whose not-idempotent
// call at the phase Mark names is in doubt (Mark empty: no call in doubt).
type UnfinishedKeys struct {
	Flow          string                `db:"flow"`
	RecoveryPoint string                `db:"recovery_point"`
	Mark          string                `db:"mark"`
	Status        idemtype.StoredStatus `db:"status"`
	Keys          int                   `db:"keys"`
}

// ReapUnfinishedResult is what one batch of [Store.ReapUnfinished] did.
type ReapUnfinishedResult struct {
	// Deleted counts the unfinished keys deleted.
	Deleted int
	// NeedsReconcile counts the unfinished keys moved to
	// StoredNeedsReconcile because their not-idempotent call is in doubt.
	NeedsReconcile int
}

// BacklogParams are the inputs of [Store.Backlog].
type BacklogParams struct {
	// Now overrides the database clock (tests); nil uses now().
	Now *time.Time
}

// ListKeysParams are the inputs of [Store.ListKeys].
type ListKeysParams struct {
	idemtype.KeyQuery
	// Now overrides the database clock (tests); nil uses now().
	Now *time.Time
}

// UnlockParams are the inputs of [Store.UnlockKey].
type UnlockParams struct {
	Scope, Key string
	// Reason is recorded as the key's last error.
	Reason string
}

// ClaimIdleParams are the inputs of [Store.ClaimIdle].
type ClaimIdleParams struct {
	// Status is StoredRunning (the completer) or StoredNeedsReconcile
	// (reconcile runs).
	Status idemtype.StoredStatus
	// Flows restricts the claim to these flow names: a process claims only
	// keys it can run. Empty claims nothing.
	Flows []string
	// IdleFor is how long a key must have gone without running (since
	// last_run_at). Must be positive.
	IdleFor time.Duration
	// MaxAttempts, when positive, skips keys that have been attempted this
	// many times, leaving them to an operator.
	MaxAttempts int
	Limit       int
	Now         *time.Time
}

// ReapUnfinishedParams are the inputs of [Store.ReapUnfinished].
type ReapUnfinishedParams struct {
	// After is how long after its creation an unfinished key is deleted,
	// for flows FlowAfter does not name; negative: never.
	After time.Duration
	// FlowAfter gives flows ages of their own; a negative one keeps the
	// flow's keys.
	FlowAfter map[string]time.Duration
	Limit     int
	// StatementTimeout bounds the batch's statement; zero leaves the
	// server's setting.
	StatementTimeout time.Duration
	Now              *time.Time
}

// ReapParams are the inputs of [Store.Reap].
type ReapParams struct {
	Limit int
	// StatementTimeout bounds the batch's statement; zero leaves the
	// server's setting.
	StatementTimeout time.Duration
	Now              *time.Time
}

// Watch is what a request waiting for a key in flight (idem.Request.Wait)
// watches: the attempt that holds the key.
type Watch struct {
	// Ref is the key's id and scope and the fence its attempt holds it at.
	Ref LockRef
	// Lapsed says the waiter, woken, found this very attempt still holding
	// the key with the lease it had: the lease looked run out to the store
	// and not to the waiter's clock (a test clock, idem.TestConfig.Now).
	// The store then wakes it at its next check of the key rather than at
	// once, so that the waiter acquires again once per check, not in a
	// loop.
	Lapsed bool
}
