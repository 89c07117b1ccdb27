package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idem/idem/idemdriver"
)

// ErrNothingToReconcile is returned by [Runner.Reconcile] for a key that is
// not in StatusNeedsReconcile. Outcome.Record shows what it is instead.
var ErrNothingToReconcile = errors.New("idem: key does not need reconciliation")

// Reconcile resolves a key in StatusNeedsReconcile: it locks the key, runs
// the reconcile hook of the phase whose not-idempotent foreign call is in
// doubt, and acts on the verdict:
//
//   - ReconcileDone: the phase is committed as if it had finished (the hook's
//     writes and checkpoint data with it), and the flow continues after it
//     to a response, so a client that gave up still gets its result stored.
//   - ReconcileNotDone: the mark is cleared and the flow continues by running
//     the phase again, which is now safe.
//   - ReconcileUnknown, or a hook error: the key stays in needs_reconcile,
//     unlocked, with the reason recorded, for a later run or an operator.
//
// A key in needs_reconcile with no call in doubt (its mark was cleared by a
// commit whose reply was lost) has nothing to ask a provider: it is resumed
// from its recovery point. The key's flow must be registered in
// Config.Flows.
func (r *Runner) Reconcile(ctx context.Context, scope, key string) (*Outcome, error) {
	out, err := r.reconcile(ctx, scope, key)
	err = callerGone(ctx, err)
	out.settle(err)
	return out, err
}

func (r *Runner) reconcile(ctx context.Context, scope, key string) (*Outcome, error) {
	cctx, cancel := r.storeContext(ctx)
	sent := r.localNow()
	acq, err := r.store.ClaimReconcile(cctx, idemdriver.ClaimParams{Scope: scope, Key: key, Lease: r.config.Lease, Now: r.now()})
	cancel()
	if err != nil {
		err = r.storeError(ctx, err)
		if ctx.Err() == nil { // else the caller went away: Reconcile labels it canceled
			r.emit(ctx, Event{Kind: EventStoreError, Scope: scope, Key: key, Err: err})
		}
		return &Outcome{}, fmt.Errorf("claim for reconcile: %w", err)
	}
	rec := acq.Record
	if rec == nil {
		return &Outcome{}, fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key)
	}
	if acq.Acquired == idemdriver.AcquiredNone {
		if rec.Status == StatusNeedsReconcile {
			return &Outcome{Record: rec, RetryAfter: retryAfter(rec, acq.DBNow, r.config.MaxRetryAfter)},
				fmt.Errorf("%w: another worker is reconciling key %q", ErrInProgress, key)
		}
		return &Outcome{Record: rec, Response: rec.Response()}, fmt.Errorf("%w: key %q is %s", ErrNothingToReconcile, key, rec.Status)
	}

	flow, ok := r.flows[rec.Flow]
	h := r.hold(flow, rec, nil, true, sent)
	h.reconciling = true
	if !ok {
		return r.leaveUnreconciled(ctx, h, fmt.Errorf("%w: %q is not in Config.Flows", ErrUnknownFlow, rec.Flow))
	}
	if h.input, err = flow.decodeStored(rec.Params); err != nil {
		return r.leaveUnreconciled(ctx, h, err)
	}
	ctx, release := r.holdLease(ctx, h)
	defer release()

	if rec.ForeignMark == "" {
		return r.resumeUnmarked(ctx, h)
	}
	phase, ok := flow.phaseIndex(rec.ForeignMark)
	if !ok {
		return r.leaveUnreconciled(ctx, h, fmt.Errorf("%w: the foreign mark names %q, which flow %q does not have", ErrUnknownRecoveryPoint, rec.ForeignMark, flow.Name()))
	}
	h.enterPhase(phase)
	var verdict Reconciliation
	result, err := r.runBody(ctx, h, func(ctx context.Context, tx Tx) (Result, *idemdriver.CommitParams, error) {
		var err error
		verdict, err = h.flow.callReconcile(ctx, tx, h)
		if err != nil {
			return Result{}, nil, fmt.Errorf("reconcile hook of phase %q: %w", h.phaseName(), err)
		}
		res, cp, err := r.resolution(h, verdict)
		if err == nil && verdict.verdict == verdictNotDone {
			err = r.withdrawMark(ctx, h)
		}
		return res, cp, err
	})
	ev := h.event(EventReconciled, err)
	ev.Verdict = verdict.verdict.String()
	r.emit(ctx, ev)
	if err != nil {
		return r.leaveUnreconciled(ctx, h, err)
	}
	h.reconciling = false
	r.log.InfoContext(ctx, "idem: reconciled", h.logAttrs("flow", flow.Name(), "phase", h.phaseName(), "verdict", verdict.verdict)...)
	switch {
	case !result.Responds() && !flow.redrives():
		return r.handBack(ctx, h)
	case verdict.verdict == verdictNotDone:
		return r.drive(ctx, h, phase)
	case result.Responds():
		return h.outcome(result.response), nil
	default:
		return r.drive(ctx, h, phase+1)
	}
}

// resolution is what a reconcile verdict records on the key: done commits the
// phase in its stead, not done leaves the recovery point where it was (its
// mark is withdrawn on its own, see withdrawMark), and unknown commits
// nothing.
func (r *Runner) resolution(h *held, v Reconciliation) (Result, *idemdriver.CommitParams, error) {
	switch v.verdict {
	case verdictNotDone:
		cp := r.commitFor(h, Result{})
		cp.RecoveryPoint, cp.CheckpointPatch = h.rec.RecoveryPoint, nil
		return Result{}, cp, nil
	case verdictDone:
		res := v.result
		switch {
		case res.err != nil:
			return res, nil, res.err
		case !res.Responds() && h.phase == len(h.flow.PhaseNames())-1:
			return res, nil, fmt.Errorf("reconcile hook of phase %q, the last, said done without a response", h.phaseName())
		}
		if res.Responds() {
			res.response = storableResponse(res.response)
		}
		return res, r.commitFor(h, res), nil
	}
	reason := v.reason
	if reason == "" {
		reason = "the reconcile hook could not tell"
	}
	return Result{}, nil, errors.New(reason)
}

// withdrawMark clears the foreign mark of a call the reconcile hook found
// not made. A phase commit retires a mark by moving the recovery point past
// it; the commit of a verdict of not done leaves the recovery point where it
// is, so the mark is cleared explicitly, before that commit. Should the
// commit then not land, the key is in needs_reconcile without a mark and is
// resumed from its recovery point, re-running the phase: what not done asks
// for anyway.
func (r *Runner) withdrawMark(ctx context.Context, h *held) error {
	mctx, cancel := r.storeContext(ctx)
	defer cancel()
	if err := r.store.ClearForeignMark(mctx, h.ref); err != nil {
		return fmt.Errorf("idem: could not withdraw the foreign mark of phase %q: %w", h.phaseName(), r.storeError(ctx, err))
	}
	return nil
}

// resumeUnmarked takes a key out of needs_reconcile that has no foreign call
// in doubt and drives it on from its recovery point.
func (r *Runner) resumeUnmarked(ctx context.Context, h *held) (*Outcome, error) {
	from, err := h.nextPhase()
	if err != nil {
		return r.leaveUnreconciled(ctx, h, err)
	}
	h.enterPhase(from)
	_, err = r.runBody(ctx, h, func(context.Context, Tx) (Result, *idemdriver.CommitParams, error) {
		return r.resolution(h, ReconcileNotDone())
	})
	if err != nil {
		return r.leaveUnreconciled(ctx, h, err)
	}
	h.reconciling = false
	if !h.flow.redrives() {
		return r.handBack(ctx, h)
	}
	r.log.InfoContext(ctx, "idem: resumed a needs_reconcile key with no call in doubt", h.logAttrs("flow", h.flow.Name(), "recovery_point", h.rec.RecoveryPoint)...)
	return r.drive(ctx, h, from)
}

// handBack releases a key a reconcile run settled when its flow cannot run
// from the input stored with it (FlowConfig.NoRedrive): the client's retry,
// which brings the whole input, carries it on.
func (r *Runner) handBack(ctx context.Context, h *held) (*Outcome, error) {
	h.lettingGo.Store(true)
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	const reason = "reconciled; the flow cannot run from its stored input (FlowConfig.NoRedrive), so the client's retry carries it on"
	if err := r.store.Release(rctx, h.ref, reason); err != nil {
		err = r.storeError(ctx, err)
		r.emit(ctx, h.event(EventStoreError, err))
		return h.outcome(nil), err
	}
	h.rec.LockedAt, h.rec.LeaseExpiresAt, h.rec.LastError = nil, nil, reason
	r.log.InfoContext(ctx, "idem: reconciled; the key waits for its client's retry", h.logAttrs("flow", h.flow.Name(), "recovery_point", h.rec.RecoveryPoint)...)
	return h.outcome(nil), fmt.Errorf("%w: key %q", ErrNoRedrive, h.rec.Key)
}

// leaveUnreconciled puts a claimed key back in needs_reconcile, unlocked,
// recording why.
func (r *Runner) leaveUnreconciled(ctx context.Context, h *held, cause error) (*Outcome, error) {
	out, err := r.toNeedsReconcile(ctx, h, r.errorText(cause))
	if errors.Is(err, ErrNeedsReconcile) {
		// Keep the cause in the chain (errors.Is) without repeating its text.
		err = fmt.Errorf("%w: key %q: %w", ErrNeedsReconcile, h.rec.Key, cause)
	}
	return out, err
}

func (v verdict) String() string {
	switch v {
	case verdictDone:
		return "done"
	case verdictNotDone:
		return "not_done"
	}
	return "unknown"
}

// Reconcile runs resolve keys stuck in needs_reconcile without waiting for a
// client: each idle needs_reconcile key of a registered flow is claimed (at
// most one instance claims it, as with the completer) and handed to
// [Runner.Reconcile], which asks the phase's reconcile hook what the provider
// did and, on a verdict, carries the flow on to its stored response. A hook
// that cannot tell yet leaves the key for the next run, IdleFor later.

// ReconcileConfig configures [Runner.ReconcileAll]. The zero value uses
// every default.
type ReconcileConfig struct {
	// IdleFor is how long a needs_reconcile key must have gone without a
	// run or a reconcile attempt before it is tried (again). It paces the
	// questions put to a provider that keeps answering "unknown".
	// Default ReconcileIdleForDefault (1m).
	IdleFor time.Duration

	// BatchSize is how many keys are claimed at a time. Default
	// ReconcileBatchSizeDefault (10).
	BatchSize int

	// MaxKeys bounds one pass. Zero (the default) runs until no idle
	// needs_reconcile key is left.
	MaxKeys int
}

// Defaults of [ReconcileConfig]'s fields.
const (
	ReconcileIdleForDefault   = time.Minute
	ReconcileBatchSizeDefault = 10
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *ReconcileConfig) WithDefaults() *ReconcileConfig {
	out := &ReconcileConfig{}
	if c != nil {
		*out = *c
	}
	out.IdleFor = cmp.Or(out.IdleFor, ReconcileIdleForDefault)
	out.BatchSize = cmp.Or(out.BatchSize, ReconcileBatchSizeDefault)
	return out
}

func (c *ReconcileConfig) validate() error {
	return validateSweep("reconcile", c.IdleFor, c.BatchSize, c.MaxKeys)
}

// ReconcileResult is what one reconcile pass did.
type ReconcileResult struct {
	// Claimed counts the needs_reconcile keys this pass picked up.
	Claimed int `json:"claimed"`
	// Resolved counts keys whose hook gave a verdict and whose flow then
	// reached a stored response.
	Resolved int `json:"resolved"`
	// Unresolved counts keys left in needs_reconcile: the hook could not
	// tell, or failed.
	Unresolved int `json:"unresolved"`
	// Skipped counts keys someone else was reconciling or had resolved.
	Skipped int `json:"skipped"`
	// Failed counts keys whose hook gave a verdict but whose flow failed
	// afterwards; they are unfinished and unlocked, for a retry or the
	// completer.
	Failed int `json:"failed"`
}

// ReconcileAll runs one reconcile pass over the idle needs_reconcile keys of
// the flows registered in Config.Flows. Each hook verdict emits
// EventReconciled; keys left unresolved emit EventNeedsReconcile again. A
// key's own failure is counted and logged, not returned. A nil config means
// the defaults.
func (r *Runner) ReconcileAll(ctx context.Context, config *ReconcileConfig) (*ReconcileResult, error) {
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	flows := r.flowNames()
	if len(flows) == 0 {
		return nil, fmt.Errorf("%w: Config.Flows is empty, so this runner cannot reconcile any key", ErrUnknownFlow)
	}
	res := &ReconcileResult{}
	err := r.sweep(ctx, StatusNeedsReconcile, flows, cfg.IdleFor, 0, cfg.BatchSize, cfg.MaxKeys, func(rec *KeyRecord) {
		res.Claimed++
		out, err := r.Reconcile(ctx, rec.Scope, rec.Key)
		log := r.log.With(r.logAttrs(rec.Scope, rec.Key, rec.ID, "flow", rec.Flow)...)
		switch {
		case out.Kind == OutcomeExecuted, errors.Is(err, ErrNoRedrive):
			res.Resolved++
		case out.Kind == OutcomeNeedsReconcile:
			res.Unresolved++
			log.InfoContext(ctx, "idem: key still needs reconciliation", "err", r.redact(err))
		case out.Kind == OutcomeInProgress || errors.Is(err, ErrNothingToReconcile) || errors.Is(err, ErrNotFound):
			res.Skipped++
		default:
			res.Failed++
			if ctx.Err() == nil {
				log.WarnContext(ctx, "idem: reconciled key failed to finish", "outcome", out.Kind, "err", r.redact(err))
			}
		}
	})
	r.logPass(ctx, "reconcile", res.Claimed, err, "resolved", res.Resolved, "unresolved", res.Unresolved,
		"skipped", res.Skipped, "failed", res.Failed)
	return res, err
}
