package idem

import "time"

// OutcomeKind is what running a request came to.
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
	// ErrUnknownRecoveryPoint); its work rolled back, no response was stored
	// and the lock was released, so a retry resumes after the phases that
	// committed, which stay, as does the key's binding to its request. Maps
	// to a retryable 500.
	OutcomeFailed OutcomeKind = "failed"
	// OutcomeInvalid: the request was rejected before anything was written
	// (ErrInvalidRequest).
	OutcomeInvalid OutcomeKind = "invalid"
	// OutcomeAbandoned: a Config.Test.Hook simulated a crash; the key is
	// left exactly as a dead process would leave it. Only tests see it.
	OutcomeAbandoned OutcomeKind = "abandoned"
)

// Outcome is the typed result of [Runner.Execute].
type Outcome struct {
	Kind OutcomeKind
	// Response is set for OutcomeExecuted and OutcomeReplayed.
	Response *Response
	// Record is the key as this call last knew it; nil when the store was
	// never reached or the request was invalid.
	Record *KeyRecord
	// RetryAfter suggests when to retry an OutcomeInProgress: the time left
	// on the holder's lease, rounded up to whole seconds, at least one and
	// at most Config.MaxRetryAfter.
	RetryAfter time.Duration
	// TookOver is true when this call resumed a key another attempt left
	// unfinished (a crash, a stale lease, an earlier failure).
	TookOver bool
}
