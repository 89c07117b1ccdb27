// What a failed attempt leaves: its key released with the error for a
// retry, or sent to needs_reconcile when a foreign call is in doubt.

package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-idem/idem/idemtype"
)

// fail ends a held request that could not finish.
func (r *Runner) fail(ctx context.Context, h *held, err error) (*Outcome, error) {
	ev := h.event("", err)
	switch {
	case h.crashed:
		// A dead process releases nothing: leave the key for the lease to
		// expire, exactly as a real crash would.
		return h.outcome(nil), err
	case errors.Is(err, ErrLockLost):
		ev.Kind = EventLockLost
		r.emit(ctx, ev)
		r.log.WarnContext(ctx, "idem: lock lost; another worker owns the key", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "fence", h.ref.Fence)...)
		return h.outcome(nil), err
	case h.foreignMarked || h.reconciling:
		return r.toNeedsReconcile(ctx, h, r.errorText(err))
	}
	// A caller that went away interrupted the phase; it did not fail
	// (Execute labels the outcome OutcomeCanceled).
	gone := ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrLockLost)
	if !gone {
		ev.Kind = EventPhaseFailed
		r.emit(ctx, ev)
	}
	h.lettingGo.Store(true)
	// Release with a context detached from the request's: a client that
	// went away must not leave the key locked for a whole lease.
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	switch rerr := r.store.Release(rctx, h.ref, r.errorText(err)); {
	case errors.Is(rerr, ErrLockLost):
		// Another worker took the key over while this one failed: it owns
		// the request now, whatever this attempt's error was.
		r.emit(ctx, h.event(EventLockLost, rerr))
		return h.outcome(nil), fmt.Errorf("%w (after: %s)", rerr, err)
	case rerr != nil:
		r.emit(ctx, h.event(EventStoreError, rerr))
		r.log.ErrorContext(ctx, "idem: could not release key; it unlocks when its lease expires", h.logAttrs("err", r.redact(rerr))...)
	}
	if gone {
		r.log.InfoContext(ctx, "idem: the caller went away; phase rolled back and key released for retry", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "err", r.redact(err))...)
		return h.outcome(nil), err
	}
	r.log.WarnContext(ctx, "idem: phase failed; key released for retry", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "err", r.redact(err))...)
	return h.outcome(nil), err
}

// undecodable releases a key taken over to be re-driven from its stored
// params, which do not decode into its flow's input (err wraps
// ErrUndecodableParams): the release records err as the key's last error,
// and the takeover counted an attempt, so the key is reported (logs, events,
// `keys list`) and turns stale after CompleteConfig.MaxAttempts instead of
// being picked up silently on every pass. A client's retry brings its own
// input and resumes it.
func (r *Runner) undecodable(ctx context.Context, h *held, err error) (*Outcome, error) {
	err = fmt.Errorf("key %q of flow %q: %w", h.rec.Key, h.flow.Name(), err)
	h.lettingGo.Store(true)
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	if rerr := r.store.Release(rctx, h.ref, r.errorText(err)); rerr != nil {
		rerr = r.storeError(ctx, rerr)
		r.emit(ctx, h.event(EventStoreError, rerr))
		r.log.ErrorContext(ctx, "idem: could not release key; it unlocks when its lease expires", h.logAttrs("err", r.redact(rerr))...)
	}
	r.emit(ctx, h.event(EventPhaseFailed, err))
	r.log.ErrorContext(ctx, "idem: the params stored with the key do not decode into its flow's input; key released for its client's retry or an operator",
		h.logAttrs("flow", h.flow.Name(), "recovery_point", h.rec.RecoveryPoint, "attempts", h.rec.Attempts, "err", r.redact(err))...)
	return h.outcome(nil), err
}

// toNeedsReconcile parks a held key whose not-idempotent call is in doubt.
// reason is stored and logged: pass error text through errorText.
func (r *Runner) toNeedsReconcile(ctx context.Context, h *held, reason string) (*Outcome, error) {
	h.lettingGo.Store(true)
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	if err := r.store.SetNeedsReconcile(rctx, h.ref, reason); err != nil {
		// Whatever happened, the mark stays on the row, so the next
		// acquisition lands here again: nothing is re-run blindly.
		err = r.storeError(ctx, err)
		r.emit(ctx, h.event(EventStoreError, err))
		return h.outcome(nil), err
	}
	h.rec.Status = idemtype.StoredNeedsReconcile
	r.emit(ctx, h.event(EventNeedsReconcile, nil))
	r.log.WarnContext(ctx, "idem: key needs reconciliation", h.logAttrs("flow", h.rec.Flow, "reason", reason)...)
	return h.outcome(nil), fmt.Errorf("%w: key %q: %s", ErrNeedsReconcile, h.rec.Key, reason)
}
