package idem

import (
	"cmp"
	"context"
	"errors"
	"time"
)

// Defaults of [ForeignRetry]'s fields.
const (
	ForeignRetryAttemptsDefault   = 3
	ForeignRetryBackoffDefault    = 100 * time.Millisecond
	ForeignRetryMaxBackoffDefault = 2 * time.Second
)

// ForeignRetry is a retry policy for a phase's foreign call
// ([Attempt.ForeignRetrying]): a transient failure of the provider is
// retried within the request, before its client hears of it, but only
// where a retry cannot make the effect happen twice:
//
//   - a failure wrapped with [NotSent] proves the request never left, so it
//     is retried in any phase;
//   - in a ForeignIdempotent phase, the provider deduplicates on the
//     downstream key, which every try sends, so a failure Retryable accepts
//     is retried too;
//   - in a ForeignNotIdempotent phase any other failure leaves the call in
//     doubt, and it is never retried: the key goes to reconciliation as
//     without a policy.
//
// Tries are bounded (Attempts), spaced by an exponential backoff, and stop
// when the next would start past the context's deadline, when the context
// ends, or when the worker's lease may have lapsed (another worker may own
// the key). The call's last error is returned.
type ForeignRetry struct {
	// Attempts is the most tries, the first included. Default
	// ForeignRetryAttemptsDefault (3).
	Attempts int
	// Backoff is the wait before the second try, doubled before each
	// next one up to MaxBackoff. Defaults ForeignRetryBackoffDefault
	// (100 ms) and ForeignRetryMaxBackoffDefault (2 s); a negative value
	// counts as its default, so tries are never sent back to back.
	Backoff, MaxBackoff time.Duration
	// Retryable says which failures of a call to a provider that
	// deduplicates (a ForeignIdempotent phase) to retry. Nil retries every
	// error but the context's. It is not asked in a ForeignNotIdempotent
	// phase, where only NotSent failures are retried.
	Retryable func(error) bool
}

// ForeignRetrying is Foreign with a retry policy: call runs until it
// succeeds or policy says to stop (see [ForeignRetry]), with the same
// downstream key each time, and counts as the phase's one foreign call.
func (r *Attempt[In]) ForeignRetrying(ctx context.Context, name string, policy ForeignRetry,
	call func(ctx context.Context, idempotencyKey string) error) error {
	attempts := cmp.Or(policy.Attempts, ForeignRetryAttemptsDefault)
	wait := cmp.Or(max(policy.Backoff, 0), ForeignRetryBackoffDefault)
	maxWait := cmp.Or(max(policy.MaxBackoff, 0), ForeignRetryMaxBackoffDefault)
	_, kind, _ := r.h.flow.phaseMeta(r.h.phase)
	retryable := func(err error) bool {
		switch {
		case errors.Is(err, ErrNotSent):
			return true
		case kind == ForeignNotIdempotent, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return false
		case policy.Retryable != nil:
			return policy.Retryable(err)
		}
		return true
	}
	return r.h.foreign(ctx, name, func(ctx context.Context, key string) error {
		for try := 1; ; try++ {
			err := call(ctx, key)
			if err == nil || try >= attempts || !retryable(err) {
				return err
			}
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
				return err
			}
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return err
			case <-timer.C:
			}
			if !r.h.leaseSafe() {
				// As before the first try: another worker may own the
				// key now, and its call must not race this one.
				return err
			}
			r.h.runner.log.InfoContext(ctx, "idem: retrying a foreign call", r.h.logAttrs("flow", r.h.flow.Name(),
				"phase", r.h.phaseName(), "foreign", name, "try", try+1, "err", err)...)
			wait = min(wait*2, maxWait)
		}
	})
}
