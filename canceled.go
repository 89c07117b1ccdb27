package idem

import (
	"context"
	"errors"
)

// callerGoneError is the error of a request whose caller's context ended
// before the request could finish. It wraps what the runner was doing when
// it noticed, the context's error and its cause, so errors.Is(err,
// context.Canceled) (or context.DeadlineExceeded) holds, as does errors.Is
// with a cause given to a context.CancelCauseFunc. Its kind is
// OutcomeCanceled.
type callerGoneError struct {
	err    error
	ctxErr error
	cause  error
}

func (e *callerGoneError) Error() string {
	if errors.Is(e.err, e.cause) {
		return "idem: the caller went away: " + e.err.Error()
	}
	return "idem: the caller went away (" + e.cause.Error() + "): " + e.err.Error()
}

func (e *callerGoneError) Unwrap() []error { return []error{e.err, e.ctxErr, e.cause} }

func isCallerGone(err error) bool {
	var gone *callerGoneError
	return errors.As(err, &gone)
}

// callerGone labels err as the caller's doing when the caller's context has
// ended and err is what that looks like to the runner: a failed phase or an
// unreachable store (a statement cut short by the cancellation). Real
// answers (in progress, mismatch, needs reconcile, invalid, lock lost) keep
// their kind even when the caller has gone meanwhile.
func callerGone(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil || isCallerGone(err) {
		return err
	}
	switch kindOf(err, false, nil) {
	case OutcomeFailed, OutcomeStoreUnavailable:
		return &callerGoneError{err: err, ctxErr: ctx.Err(), cause: context.Cause(ctx)}
	}
	return err
}
