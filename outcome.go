package idem

import (
	"errors"
	"time"

	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/hooks"
)

// OutcomeKind is what running a request came to. It is derived from the
// returned error: each kind below names the sentinel that yields it. One
// kind is not exported: a crash that a test hook simulated (idemtest) comes
// back as "simulated_crash", which errors.Is(err, idemtest.ErrSimulatedCrash)
// recognises.
type OutcomeKind string

const (
	// OutcomeExecuted: this call ran the flow (or its remaining phases) to a
	// response, which is now stored.
	OutcomeExecuted OutcomeKind = "executed"
	// OutcomeReplayed: the key had finished; Response is the stored one,
	// byte for byte, and no phase ran.
	OutcomeReplayed OutcomeKind = "replayed"
	// OutcomeInProgress: another worker holds the key (ErrInProgress).
	OutcomeInProgress OutcomeKind = "in_progress"
	// OutcomeMismatch: the key belongs to a different request (ErrMismatch).
	OutcomeMismatch OutcomeKind = "mismatch"
	// OutcomeNeedsReconcile: the key waits for reconciliation
	// (ErrNeedsReconcile).
	OutcomeNeedsReconcile OutcomeKind = "needs_reconcile"
	// OutcomeLockLost: this worker's lease was taken over mid-flight
	// (ErrLockLost).
	OutcomeLockLost OutcomeKind = "lock_lost"
	// OutcomeStoreUnavailable: the database could not be reached
	// (ErrStoreUnavailable).
	OutcomeStoreUnavailable OutcomeKind = "store_unavailable"
	// OutcomeFailed: a phase failed (ErrPhaseFailed, ErrRetriesExhausted,
	// ErrUnknownRecoveryPoint, ErrUnknownFlow, or any other error); its work
	// rolled back, no response was stored and the lock was released, so a
	// retry resumes after the phases that committed, which stay, as does the
	// key's binding to its request. Maps to a retryable 500.
	OutcomeFailed OutcomeKind = "failed"
	// OutcomeTooManyKeys: Config.Admit refused to let the request create a
	// new key (ErrTooManyKeys); nothing was written. Retry after
	// Outcome.RetryAfter.
	OutcomeTooManyKeys OutcomeKind = "too_many_keys"
	// OutcomeInvalid: the request was rejected before anything was written
	// (ErrInvalidRequest, or ErrNotFound for a key that does not exist).
	OutcomeInvalid OutcomeKind = "invalid"
	// OutcomeCanceled: the caller's context ended (cancelled, or its
	// deadline passed) before the request could finish. The error wraps the
	// context's error (errors.Is(err, context.Canceled) or
	// context.DeadlineExceeded holds) and what the runner was doing when it
	// noticed. Nothing was stored; a phase that was running rolled back and
	// the key was released, so a retry resumes after the phases that
	// committed. It is the caller's doing, not a failure of the store or of
	// a phase, and is logged as neither.
	OutcomeCanceled OutcomeKind = "canceled"
	// OutcomeRequestAbandoned: an operator abandoned the request with
	// Runner.Resolve (ErrRequestAbandoned). The key is finished and nothing
	// runs; every retry with it gets this outcome. HTTP adapters answer a
	// final, non-retryable problem.
	OutcomeRequestAbandoned OutcomeKind = "request_abandoned"
)

// outcomeSimulatedCrash: a test hook simulated a crash
// (hooks.ErrSimulatedCrash); the key is left exactly as a dead process would
// leave it. Only tests see it, and the adapters recognise it by its error.
const outcomeSimulatedCrash OutcomeKind = "simulated_crash"

// kindOf derives an outcome's kind from the error the runner returned with it:
// the error is the one source of truth, and this is the one place it is read.
// When an error wraps several sentinels, the first case here decides.
func kindOf(err error, replayed bool, rec *idemtype.KeyRecord) OutcomeKind {
	switch {
	case err == nil && replayed:
		return OutcomeReplayed
	case err == nil:
		return OutcomeExecuted
	case errors.Is(err, hooks.ErrSimulatedCrash):
		return outcomeSimulatedCrash
	case isCallerGone(err):
		return OutcomeCanceled
	case errors.Is(err, ErrNothingToReconcile) && rec != nil:
		switch rec.Status {
		case idemtype.StoredFinished:
			return OutcomeReplayed
		case idemtype.StoredNeedsReconcile:
			return OutcomeNeedsReconcile
		}
		return OutcomeInProgress
	case errors.Is(err, ErrLockLost):
		return OutcomeLockLost
	case errors.Is(err, ErrNeedsReconcile):
		return OutcomeNeedsReconcile
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case errors.Is(err, ErrMismatch):
		return OutcomeMismatch
	case errors.Is(err, ErrRequestAbandoned):
		return OutcomeRequestAbandoned
	case errors.Is(err, ErrTooManyKeys):
		return OutcomeTooManyKeys
	case errors.Is(err, ErrPhaseFailed):
		// A phase's failure, whatever it wraps (input the database refused
		// after an earlier phase committed, say): the retry resumes.
		return OutcomeFailed
	case errors.Is(err, ErrInvalidRequest), errors.Is(err, ErrNotFound):
		return OutcomeInvalid
	case errors.Is(err, ErrStoreUnavailable):
		return OutcomeStoreUnavailable
	}
	return OutcomeFailed
}

// settle sets the outcome's Kind from the error it is returned with.
func (o *Outcome) settle(err error) {
	o.Kind = kindOf(err, o.replayed, o.Record)
}

// Outcome is the typed result of [Runner.Execute] and [Runner.Reconcile]. Its
// Kind is derived from the error returned with it, never set on its own.
type Outcome struct {
	Kind OutcomeKind
	// Response is set for OutcomeExecuted and OutcomeReplayed.
	Response *idemtype.Response
	// Record is the key as this call last knew it; nil when the store was
	// never reached or the request was invalid. A replay's record has no
	// Params or Checkpoint (the acquisition does not read them);
	// Runner.GetKey returns the whole key.
	Record *idemtype.KeyRecord
	// RetryAfter suggests when to retry an OutcomeInProgress (the time left
	// on the holder's lease, rounded up to whole seconds, at least one and
	// at most Config.MaxRetryAfter) or an OutcomeTooManyKeys (what
	// Config.Admit said).
	RetryAfter time.Duration
	// TookOver is true when this call resumed a key another attempt left
	// unfinished (a crash, a stale lease, an earlier failure).
	TookOver bool
	// Waited is how long the call waited for another attempt of its key
	// to end (Request.Wait); zero when it did not wait.
	Waited time.Duration

	replayed bool
}
