package idem

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-idem/idem/idemtype"
)

// Sentinel errors. Callers branch with errors.Is. An error may wrap more than
// one (a lock lost while a failed phase was being released wraps ErrLockLost
// and the phase's own error); Outcome.Kind says which one the runner acted
// on, in the order of its derivation (see [OutcomeKind]).
var (
	// ErrInvalidRequest: the request itself is unusable (empty scope, a key
	// that is not 1-255 printable ASCII characters, params that do not decode
	// into the flow's input). Nothing was written.
	ErrInvalidRequest = idemtype.ErrInvalidRequest

	// ErrInvalidParams: the params do not decode into the flow's input, are
	// JSON that Fingerprint refuses, or hold what the key store cannot keep
	// (the NUL character, which JSON allows and Postgres refuses). It wraps
	// ErrInvalidRequest. Nothing was written; an HTTP adapter answers it as
	// invalid input.
	ErrInvalidParams = fmt.Errorf("%w: params", ErrInvalidRequest)

	// ErrInProgress: another worker holds a live lease on the key. Nothing
	// was executed or stored; retry after Outcome.RetryAfter.
	ErrInProgress = errors.New("idem: request in progress")

	// ErrMismatch: the key was first used with a different flow, method,
	// path or params. Checked before any lock is taken.
	ErrMismatch = errors.New("idem: key reused with a different request")

	// ErrNeedsReconcile: a not-idempotent foreign call may have happened
	// without its phase committing. The key will not execute again until a
	// reconcile run decides what the provider did.
	ErrNeedsReconcile = errors.New("idem: key needs reconciliation")

	// ErrLockLost: the lease was taken over (or the key force-unlocked) while
	// this worker ran; its uncommitted phase was rolled back. Another worker
	// owns the request now.
	ErrLockLost = idemtype.ErrLockLost

	// ErrStoreUnavailable: the database could not be reached. When it happens
	// before acquisition no phase ran (fail closed).
	ErrStoreUnavailable = idemtype.ErrStoreUnavailable

	// ErrPhaseFailed: a phase returned an error or panicked. Its transaction
	// rolled back, the lock was released and no response was stored, so a
	// retry resumes at the same phase; earlier phases stay committed.
	ErrPhaseFailed = errors.New("idem: phase failed")

	// ErrRetriesExhausted: a phase kept failing with serialization failures
	// or deadlocks past Config.MaxPhaseRetries. The lock was released; the
	// request is safe to retry later.
	ErrRetriesExhausted = errors.New("idem: phase retries exhausted")

	// ErrSerialization is what a store maps serialization failures and
	// deadlocks to; the runner retries phases that fail with it.
	ErrSerialization = idemtype.ErrSerialization

	// ErrSecondForeignCall: a phase called Attempt.Foreign twice. A phase may
	// make at most one foreign call, so that a crash between two calls can
	// never leave one done and one not.
	ErrSecondForeignCall = errors.New("idem: second foreign call in one phase")

	// ErrRequestAbandoned: an operator abandoned the request with
	// [Runner.Resolve] while its not-idempotent call was in doubt. The key is
	// finished: every retry with it gets this error (OutcomeRequestAbandoned),
	// and nothing runs. A new request needs a new key.
	ErrRequestAbandoned = errors.New("idem: request abandoned by an operator")

	// ErrUnknownFlow: a key names a flow the runner has not been given
	// (Config.Flows), so it cannot be completed or reconciled here.
	ErrUnknownFlow = errors.New("idem: unknown flow")

	// ErrUnknownRecoveryPoint: a key's recovery point is not a phase of its
	// flow, typically because a deploy renamed or removed a phase while
	// requests were in flight. The key is left for an operator.
	ErrUnknownRecoveryPoint = errors.New("idem: unknown recovery point")

	// ErrNoRedrive: Runner.Reconcile settled the phase in doubt of a key
	// whose flow cannot run from the input stored with its key
	// (FlowConfig.NoRedrive), and released the key for its client's retry,
	// which brings the whole input and carries the request on.
	ErrNoRedrive = errors.New("idem: the key waits for its client's retry")

	// ErrUndecodableParams: the params stored with a key do not decode into
	// its flow's input type as this binary declares it (a deploy changed a
	// field's type, say). Decoding is tolerant otherwise: a field added
	// since gets its zero value, one removed is ignored. The completer
	// records it on the key (its last error, an attempt) and releases it,
	// so the key waits for its client's retry, which brings its own input,
	// and turns stale after CompleteConfig.MaxAttempts for an operator; a
	// reconcile run leaves the key in needs_reconcile with it as the reason.
	ErrUndecodableParams = errors.New("idem: the params stored with the key do not decode into the flow's input")

	// ErrNotFound: no key with that scope and key exists.
	ErrNotFound = idemtype.ErrNotFound

	// ErrPhaseOwnsTx is what Commit and Rollback of [Attempt.PgxTx] return:
	// only the runner ends a phase's transaction, together with the key's
	// recovery point.
	ErrPhaseOwnsTx = idemtype.ErrPhaseOwnsTx
)

// ErrNoReconcileHook: a key's not-idempotent call is in doubt at a phase that
// has no Reconcile hook in this binary (its flow declares the phase without
// ForeignNotIdempotent here: an operations binary built without it, or a
// deploy that switched the phase to idempotent while keys were in doubt).
// Runner.Reconcile refuses such a key before claiming it, so it moves no
// counter (neither its fence nor its attempts) and stays as it is, in
// needs_reconcile, for a binary that has the hook. The error is a
// *NoReconcileHookError, which names the flow and the phase, and it also wraps
// ErrNeedsReconcile. [Runner.CheckReconcileHooks] finds such keys up front.
var ErrNoReconcileHook = errors.New("idem: no reconcile hook")

// NoReconcileHookError is the error of [ErrNoReconcileHook]: Flow's phase Phase
// has no Reconcile hook in this binary.
type NoReconcileHookError struct {
	Flow, Phase string
}

func (e *NoReconcileHookError) Error() string {
	return fmt.Sprintf("idem: flow %q phase %q has a call in doubt but no Reconcile hook in this binary; "+
		"reconcile it with a binary whose phase is ForeignNotIdempotent with a Reconcile hook (the key is left as it is)", e.Flow, e.Phase)
}

// Unwrap returns ErrNoReconcileHook.
func (e *NoReconcileHookError) Unwrap() error { return ErrNoReconcileHook }

// ErrTooManyKeys: Config.Admit refused to let the request create a new key
// (the scope has too many). Nothing was written; retry after
// Outcome.RetryAfter. Admit returns it through [TooManyKeys], which carries
// the delay.
var ErrTooManyKeys = errors.New("idem: too many keys")

// TooManyKeysError is the error [TooManyKeys] returns: it wraps
// ErrTooManyKeys and says when to retry.
type TooManyKeysError struct {
	// RetryAfter is when the scope may create a key again; at least a
	// second.
	RetryAfter time.Duration
}

func (e *TooManyKeysError) Error() string {
	return fmt.Sprintf("%s: retry after %s", ErrTooManyKeys, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrTooManyKeys) true.
func (e *TooManyKeysError) Unwrap() error { return ErrTooManyKeys }

// TooManyKeys is what a Config.Admit hook returns to refuse a new key: the
// scope may try again after retryAfter (rounded up to whole seconds, at
// least one).
func TooManyKeys(retryAfter time.Duration) error {
	secs := max((retryAfter+time.Second-1)/time.Second, 1)
	return &TooManyKeysError{RetryAfter: secs * time.Second}
}

// ErrNotSent marks a foreign call's error as proof that the request never
// left this process: the provider cannot have acted on it. Wrap such an
// error with [NotSent] inside the call given to [Attempt.Foreign]. In a
// ForeignNotIdempotent phase the runner then withdraws the mark it made
// before the call, so the failure is an ordinary failed phase (rolled
// back, key released, OutcomeFailed: a retryable answer) rather than a
// call in doubt for reconciliation. In any other phase it changes nothing.
var ErrNotSent = errors.New("idem: foreign call not sent")

// NotSent wraps err, an error that proves the foreign call's request was
// never written to the provider, so that errors.Is(err, ErrNotSent) and
// errors.Is(err, cause) both hold. NotSent(nil) is nil.
//
// Wrap only errors that prove the request never left, never a timeout or
// a broken connection after the request was written (the provider may
// have acted), and never a guess. These do:
//
//   - net/http: a dial error, errors.As(err, &opErr) with a *net.OpError
//     whose Op is "dial": the connection was refused, the host's name did
//     not resolve (a *net.DNSError inside), or the dial timed out; the
//     request is written only on a connection that was made. Also an
//     error of http.NewRequest, before anything is sent.
//   - pgx (a provider reached through Postgres): an error for which
//     pgconn.SafeToRetry(err) is true, which pgx reports only when no
//     byte of the statement was sent.
//   - a client-side validation error the provider's SDK returns before it
//     sends anything.
//
// A gRPC status of codes.Unavailable does not prove it: gRPC returns it
// for a connection that broke after the request went out too.
func NotSent(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNotSent, err)
}

// PanicError is the error a phase's panic becomes. It wraps ErrPhaseFailed.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("idem: phase panicked: %v", e.Value) }

// Unwrap makes errors.Is(err, ErrPhaseFailed) true.
func (e *PanicError) Unwrap() error { return ErrPhaseFailed }
