package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/hooks"
)

// A body is a phase-like body: a phase's Do, or a reconcile hook speaking for
// the phase. It runs inside the phase's transaction and returns the result to
// hand back and what to record on the key with the commit.
type body func(ctx context.Context, tx Tx) (Result, *idemdriver.CommitParams, error)

// runBody is the one place a phase-like body runs: for the held key's current
// phase it opens the store's transaction, runs the body with the test hooks,
// a span and panics turned into *PanicError (with the stack), commits what
// the body asks for guarded by the fence, and retries serialization failures
// and deadlocks with backoff. It returns once the commit is known to have
// landed, or with the error that ended the phase.
func (r *Runner) runBody(ctx context.Context, h *held, b body) (Result, error) {
	_, _, iso := h.flow.phaseMeta(h.phase)
	if iso == "" {
		iso = r.config.Isolation
	}
	backoff := r.config.PhaseRetryBackoff
	for {
		h.beginAttempt()
		res, err := r.attemptBody(ctx, h, b, iso)
		if err == nil || h.crashed || !errors.Is(err, ErrSerialization) {
			return res, err
		}
		if h.foreignMarked {
			// The not-idempotent call may have happened: re-running the
			// body could repeat it. fail() sends the key to reconcile.
			return res, err
		}
		if h.attempt > r.config.MaxPhaseRetries {
			return res, fmt.Errorf("%w: phase %q failed %d times: %w", ErrRetriesExhausted, h.phaseName(), h.attempt, err)
		}
		r.emit(ctx, h.event(EventPhaseRetried, err))
		r.log.DebugContext(ctx, "idem: retrying phase", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "attempt", h.attempt, "err", r.redact(err))...)
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff *= 2
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return res, context.Cause(ctx)
		}
	}
}

// attemptBody is one try of the body in its own transaction.
func (r *Runner) attemptBody(ctx context.Context, h *held, b body, iso pgx.TxIsoLevel) (res Result, err error) {
	ctx, end := r.startPhase(ctx, h.flow.Name(), h.phaseName(), h.attempt)
	defer func() { end(err) }()
	started := time.Now()

	bctx, cancel := r.storeContext(ctx)
	tx, err := r.store.BeginPhase(bctx, r.phaseOptions(iso))
	cancel()
	if err != nil {
		return res, r.classify(ctx, h, nil, r.storeError(ctx, err))
	}
	over := false
	defer func() {
		if !over {
			// A context detached from cancellation: the rollback must reach
			// the server even when the request's context is done.
			rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
			_ = tx.RollbackPhase(rctx)
			cancel()
		}
	}()

	h.tx = tx
	defer func() { h.tx = nil }()
	if err := r.hook(ctx, h, hooks.PhaseStart); err != nil {
		return res, r.classify(ctx, h, tx, err)
	}
	res, cp, err := callBody(ctx, tx, b)
	if err == nil {
		err = r.hook(ctx, h, hooks.BeforeCommit)
	}
	if err != nil {
		return res, r.classify(ctx, h, tx, err)
	}

	if cp.Status == idemtype.StoredFinished {
		h.lettingGo.Store(true)
	}
	// The commit does not depend on the caller staying: a phase whose body
	// finished is committed (or refused by the fence), within the bound.
	cctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	err = tx.CommitPhase(cctx, *cp)
	cancel()
	over = true
	switch {
	case errors.Is(err, ErrLockLost):
		h.lettingGo.Store(false)
		return res, err
	case err != nil:
		// The reply was lost or refused: find out from the key itself
		// whether the commit landed, never by guessing.
		var landed bool
		if landed, err = r.commitLanded(ctx, h, cp, err); !landed {
			h.lettingGo.Store(false)
			return res, err
		}
	}
	h.committed(cp)
	if cp.RecoveryPoint != h.phaseName() && cp.Status != idemtype.StoredFinished {
		// A reconcile verdict of not happened: it cleared the mark and left the
		// recovery point where it was; the phase itself has not committed.
		return res, nil
	}
	// Every phase of the transaction committed at once: the first and those
	// that joined it, each reported as a phase of its own, and then each
	// phase's after-commit test point in turn.
	last, took := h.phase, time.Since(started)
	defer func() { h.phase = last }()
	for h.phase = h.first; h.phase <= last; h.phase++ {
		r.emit(ctx, Event{Kind: EventPhaseCommitted, Flow: h.flow.Name(), Scope: h.rec.Scope, Key: h.rec.Key, Phase: h.phaseName(), Attempt: h.attempt, Duration: took})
	}
	for h.phase = h.first; h.phase <= last; h.phase++ {
		if herr := r.hook(ctx, h, hooks.AfterCommit); herr != nil {
			if h.crashed {
				return res, herr
			}
			// A test playing a lost acknowledgement: this worker cannot know
			// the commit landed, so it reads the key as it would for a real one.
			if landed, err := r.commitLanded(ctx, h, cp, herr); !landed {
				return res, err
			}
		}
	}
	return res, nil
}

// callBody runs b, turning a panic into a *PanicError with its stack.
func callBody(ctx context.Context, tx Tx, b body) (res Result, cp *idemdriver.CommitParams, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return b(ctx, tx)
}

// commitLanded re-reads the key after a commit whose outcome is unknown
// (its reply was lost, its context ended, the connection broke) and reports
// whether the commit landed: the key still carries this worker's fence and
// records what the commit recorded. When the key cannot be read either, the
// answer is unknown: the error says the store is unavailable, and the key,
// with whatever it holds, is left to the next attempt, which reads it again.
func (r *Runner) commitLanded(ctx context.Context, h *held, cp *idemdriver.CommitParams, commitErr error) (bool, error) {
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	rec, err := r.store.GetKey(rctx, h.rec.Scope, h.rec.Key)
	if err != nil {
		return false, fmt.Errorf("%w: the commit of phase %q may or may not have landed (%w), and the key could not be read: %w",
			ErrStoreUnavailable, h.phaseName(), commitErr, r.storeError(ctx, err))
	}
	switch {
	case rec.ID != h.ref.ID:
		// The key this worker held was reaped or abandoned; another
		// request made the one there now.
		return false, fmt.Errorf("%w: the key was made anew (id %d, not %d) while the commit of phase %q was in doubt", ErrLockLost, rec.ID, h.ref.ID, h.phaseName())
	case rec.Fence != h.ref.Fence:
		return false, fmt.Errorf("%w: the key moved to fence %d while the commit of phase %q was in doubt", ErrLockLost, rec.Fence, h.phaseName())
	case rec.Status == cp.Status && rec.RecoveryPoint == cp.RecoveryPoint && rec.ForeignMark == "":
		r.log.InfoContext(ctx, "idem: a phase commit whose reply was lost had landed", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "err", r.redact(commitErr))...)
		return true, nil
	}
	h.rec.ForeignMark = rec.ForeignMark
	return false, r.afterWrites(h, r.storeError(ctx, commitErr))
}

// afterWrites turns ErrInvalidRequest (input the database cannot store,
// found by a phase's statement or by its commit) into a phase failure once
// something was written: a phase committed before, or this one made its
// foreign call. Bad input means "nothing written" only before that; after,
// the request's retry resumes.
func (r *Runner) afterWrites(h *held, err error) error {
	if errors.Is(err, ErrInvalidRequest) && !errors.Is(err, ErrPhaseFailed) &&
		(h.rec.RecoveryPoint != idemtype.RecoveryPointStarted || h.foreignBy != "") {
		return fmt.Errorf("%w: phase %q: %w", ErrPhaseFailed, h.phaseName(), err)
	}
	return err
}

// providerDeadline reports whether err, a phase's error, is the deadline of
// the phase's foreign call (a provider's timeout: an http.Client's Timeout, a
// context.WithTimeout around the call): a phase failure, not the store
// failing to answer.
func (h *held) providerDeadline(err error) bool {
	return h.foreignErr != nil && errors.Is(h.foreignErr, context.DeadlineExceeded) && errors.Is(err, context.DeadlineExceeded)
}

// classify turns a body attempt's error into the error the runner acts on.
// tx is the phase's transaction, still open, or nil before it exists.
func (r *Runner) classify(ctx context.Context, h *held, tx idemdriver.PhaseTx, err error) error {
	switch {
	case h.crashed || errors.Is(err, hooks.ErrSimulatedCrash):
		h.crashed = true
		return hooks.ErrSimulatedCrash
	case errors.Is(context.Cause(ctx), ErrLockLost):
		// The heartbeat found the lease gone and cancelled the phase.
		return fmt.Errorf("%w: phase %q", ErrLockLost, h.phaseName())
	case errors.Is(err, ErrLockLost):
		return err
	}
	mapped := err
	if tx != nil {
		mapped = tx.ClassifyError(err)
		if !h.providerDeadline(err) {
			mapped = r.storeError(ctx, mapped)
		}
	}
	if mapped = r.afterWrites(h, mapped); errors.Is(mapped, ErrPhaseFailed) {
		return mapped
	}
	if errors.Is(mapped, ErrSerialization) || errors.Is(mapped, ErrStoreUnavailable) || errors.Is(mapped, ErrInvalidRequest) {
		return mapped
	}
	var pe *PanicError
	if errors.As(err, &pe) || errors.Is(err, ErrPhaseFailed) {
		return err
	}
	return fmt.Errorf("%w: phase %q: %w", ErrPhaseFailed, h.phaseName(), err)
}

func (r *Runner) hook(ctx context.Context, h *held, where hooks.Where) error {
	return r.hookAt(ctx, h, hooks.Point{Where: where})
}

func (r *Runner) hookAt(ctx context.Context, h *held, at hooks.Point) error {
	if r.config.Test.hook == nil {
		return nil
	}
	if h.crashed {
		// A dead process reaches no later point, and commits nothing,
		// whatever the phase made of the crash Foreign returned to it.
		return hooks.ErrSimulatedCrash
	}
	at.Flow, at.Phase, at.Attempt, at.Key = h.flow.Name(), h.phaseName(), h.attempt, h.rec.Clone()
	_, kind, _ := h.flow.phaseMeta(h.phase)
	at.ForeignKind = int(kind)
	err := r.config.Test.hook(ctx, at)
	if errors.Is(err, hooks.ErrSimulatedCrash) {
		h.crashed = true
	}
	return err
}
