package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// ErrNothingToReconcile is returned by [Runner.Reconcile] for a key that is
// not in StoredNeedsReconcile. Outcome.Record shows what it is instead.
var ErrNothingToReconcile = errors.New("idem: key does not need reconciliation")

// Reconcile resolves a key in StoredNeedsReconcile: it locks the key, runs
// the reconcile hook of the phase whose not-idempotent foreign call is in
// doubt, and acts on the verdict:
//
//   - ReconcileHappened: the phase is committed as if it had finished (the hook's
//     writes and checkpoint data with it), and the flow continues after it
//     to a response, so a client that gave up still gets its result stored.
//   - ReconcileNotHappened: the mark is cleared and the flow continues by running
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
	if out, err := r.refuseWithoutHook(ctx, scope, key); err != nil {
		return out, err
	}
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
		if rec.Status == idemtype.StoredNeedsReconcile {
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
	if !flow.reconcilable(phase) {
		// The key changed between refuseWithoutHook's read and the claim.
		return r.leaveUnreconciled(ctx, h, &NoReconcileHookError{Flow: flow.Name(), Phase: rec.ForeignMark})
	}
	h.enterPhase(phase)
	var verdict ReconcileVerdict
	result, err := r.runBody(ctx, h, func(ctx context.Context, tx Tx) (Result, *idemdriver.CommitParams, error) {
		var err error
		verdict, err = h.flow.callReconcile(ctx, tx, h)
		if err != nil {
			return Result{}, nil, fmt.Errorf("reconcile hook of phase %q: %w", h.phaseName(), err)
		}
		res, cp, err := r.resolution(h, verdict)
		if err == nil && verdict.verdict == verdictNotHappened {
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
	case !result.Responds() && !flow.Redrives():
		return r.handBack(ctx, h)
	case verdict.verdict == verdictNotHappened:
		return r.drive(ctx, h, phase)
	case result.Responds():
		return h.outcome(result.response), nil
	default:
		return r.drive(ctx, h, phase+1)
	}
}

// refuseWithoutHook reads the key before it is claimed and refuses one whose
// call in doubt is at a phase without a Reconcile hook in this binary:
// claiming it would move its fence and attempts for nothing, on every try.
// Whatever else the read finds (or a failed read) is left to the claim.
func (r *Runner) refuseWithoutHook(ctx context.Context, scope, key string) (*Outcome, error) {
	gctx, cancel := r.storeContext(ctx)
	rec, err := r.store.GetKey(gctx, scope, key)
	cancel()
	if err != nil || rec.Status != idemtype.StoredNeedsReconcile || rec.ForeignMark == "" {
		return nil, nil
	}
	flow, ok := r.flows[rec.Flow]
	if !ok {
		return nil, nil
	}
	if i, ok := flow.phaseIndex(rec.ForeignMark); !ok || flow.reconcilable(i) {
		return nil, nil
	}
	missing := &NoReconcileHookError{Flow: rec.Flow, Phase: rec.ForeignMark}
	r.log.WarnContext(ctx, "idem: a key's call in doubt has no reconcile hook in this binary; the key is left as it is",
		r.logAttrs(scope, key, rec.ID, "flow", rec.Flow, "phase", rec.ForeignMark)...)
	return &Outcome{Record: rec}, fmt.Errorf("%w: %w", ErrNeedsReconcile, missing)
}

// MissingHook is a phase of a registered flow at which keys have a
// not-idempotent call in doubt but which has no Reconcile hook in this
// binary (see [ErrNoReconcileHook]); [Runner.CheckReconcileHooks] reports
// them.
type MissingHook struct {
	Flow  string `json:"flow"`
	Phase string `json:"phase"`
	// Keys counts the keys in doubt at the phase; NeedsReconcile counts
	// those of them already in needs_reconcile (the others are running or
	// stale, and go there on their next attempt).
	Keys           int `json:"keys"`
	NeedsReconcile int `json:"needs_reconcile"`
}

// CheckReconcileHooks looks for keys in doubt that this binary cannot
// reconcile: unfinished keys of the flows in Config.Flows whose
// not-idempotent call is in doubt (a foreign mark stands) at a phase that has
// no Reconcile hook here, or that the flow no longer has. Each such phase is
// logged as an error and returned. Run it at startup (the Maintainer does,
// when it runs reconcile passes): a binary that declares a phase without
// ForeignNotIdempotent, or a deploy that switched a phase to idempotent while
// keys were in doubt, leaves those keys for an operator or a binary that has
// the hook.
func (r *Runner) CheckReconcileHooks(ctx context.Context) ([]MissingHook, error) {
	flows := r.flowNames()
	if len(flows) == 0 {
		return nil, nil
	}
	qctx, cancel := r.storeContext(ctx)
	groups, err := r.store.UnfinishedKeys(qctx, flows)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("check reconcile hooks: %w", r.storeError(ctx, err))
	}
	var missing []MissingHook
	for _, g := range groups {
		flow, ok := r.flows[g.Flow]
		if !ok || g.Mark == "" {
			continue
		}
		if i, ok := flow.phaseIndex(g.Mark); ok && flow.reconcilable(i) {
			continue
		}
		i := slices.IndexFunc(missing, func(m MissingHook) bool { return m.Flow == g.Flow && m.Phase == g.Mark })
		if i < 0 {
			i = len(missing)
			missing = append(missing, MissingHook{Flow: g.Flow, Phase: g.Mark})
		}
		m := &missing[i]
		m.Keys += g.Keys
		if g.Status == idemtype.StoredNeedsReconcile {
			m.NeedsReconcile += g.Keys
		}
	}
	for _, m := range missing {
		r.log.ErrorContext(ctx, "idem: keys have a call in doubt at a phase with no reconcile hook in this binary; they cannot be reconciled here",
			"flow", m.Flow, "phase", m.Phase, "keys", m.Keys, "needs_reconcile", m.NeedsReconcile)
	}
	return missing, nil
}

// resolution is what a reconcile verdict records on the key: done commits the
// phase in its stead, not done leaves the recovery point where it was (its
// mark is withdrawn on its own, see withdrawMark), and unknown commits
// nothing.
func (r *Runner) resolution(h *held, v ReconcileVerdict) (Result, *idemdriver.CommitParams, error) {
	switch v.verdict {
	case verdictNotHappened:
		cp := r.commitFor(h, Result{})
		cp.RecoveryPoint, cp.CheckpointPatch = h.rec.RecoveryPoint, nil
		return Result{}, cp, nil
	case verdictHappened:
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
// it; the commit of a verdict of not happened leaves the recovery point where it
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
		return r.resolution(h, ReconcileNotHappened())
	})
	if err != nil {
		return r.leaveUnreconciled(ctx, h, err)
	}
	h.reconciling = false
	if !h.flow.Redrives() {
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

// LogValue makes a log record show the verdict's name ("not_happened") under
// any handler, the JSON one included, rather than the integer behind it.
func (v verdict) LogValue() slog.Value { return slog.StringValue(v.String()) }

func (v verdict) String() string {
	switch v {
	case verdictHappened:
		return "happened"
	case verdictNotHappened:
		return "not_happened"
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
	// NoHook counts keys left as they were because their call in doubt is
	// at a phase with no Reconcile hook in this binary (ErrNoReconcileHook).
	NoHook int `json:"no_hook"`
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
	err := r.sweep(ctx, idemtype.StoredNeedsReconcile, flows, cfg.IdleFor, 0, cfg.BatchSize, cfg.MaxKeys, func(rec *idemtype.KeyRecord) {
		res.Claimed++
		out, err := r.Reconcile(ctx, rec.Scope, rec.Key)
		log := r.log.With(r.logAttrs(rec.Scope, rec.Key, rec.ID, "flow", rec.Flow)...)
		switch {
		case out.Kind == OutcomeExecuted, errors.Is(err, ErrNoRedrive):
			res.Resolved++
		case errors.Is(err, ErrNoReconcileHook):
			res.NoHook++
			log.WarnContext(ctx, "idem: key left as it is: no reconcile hook in this binary", "err", r.redact(err))
		case out.Kind == OutcomeNeedsReconcile:
			res.Unresolved++
			log.InfoContext(ctx, "idem: key still needs reconciliation", "err", r.logErr(err, rec.Scope, rec.Key))
		case out.Kind == OutcomeInProgress || errors.Is(err, ErrNothingToReconcile) || errors.Is(err, ErrNotFound):
			res.Skipped++
		default:
			res.Failed++
			if ctx.Err() == nil {
				log.WarnContext(ctx, "idem: reconciled key failed to finish", "outcome", out.Kind, "err", r.logErr(err, rec.Scope, rec.Key))
			}
		}
	})
	r.logPass(ctx, "reconcile", res.Claimed, err, "resolved", res.Resolved, "unresolved", res.Unresolved,
		"skipped", res.Skipped, "failed", res.Failed, "no_hook", res.NoHook)
	return res, err
}
