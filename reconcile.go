package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
//   - ReconcileUnknown, or a hook error: the key stays in needs-reconcile,
//     unlocked, with the reason recorded, for a later run or an operator.
//
// The key's flow must be registered in Config.Flows.
func (r *Runner) Reconcile(ctx context.Context, scope, key string) (*Outcome, error) {
	acq, err := r.store.ClaimReconcile(ctx, ClaimParams{Scope: scope, Key: key, Lease: r.config.Lease, Now: r.now()})
	if err != nil {
		r.emit(ctx, Event{Kind: EventStoreError, Scope: scope, Key: key, Err: err})
		if errors.Is(err, ErrStoreUnavailable) {
			return &Outcome{Kind: OutcomeStoreUnavailable}, fmt.Errorf("claim for reconcile: %w", err)
		}
		return &Outcome{Kind: OutcomeFailed}, fmt.Errorf("claim for reconcile: %w", err)
	}
	rec := acq.Record
	if rec == nil {
		return &Outcome{Kind: OutcomeInvalid}, fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key)
	}
	if acq.Acquired == AcquiredNone {
		if rec.Status == StatusNeedsReconcile {
			return &Outcome{Kind: OutcomeInProgress, Record: rec, RetryAfter: retryAfter(rec, acq.DBNow, r.config.MaxRetryAfter)},
				fmt.Errorf("%w: another worker is reconciling key %q", ErrInProgress, key)
		}
		return &Outcome{Kind: outcomeOfStatus(rec.Status), Record: rec, Response: rec.Response()},
			fmt.Errorf("%w: key %q is %s", ErrNothingToReconcile, key, rec.Status)
	}

	flow, ok := r.flows[rec.Flow]
	st := &runState{runner: r, flow: flow, rec: rec, ref: LockRef{ID: rec.ID, Fence: rec.Fence}}
	if !ok {
		return r.leaveUnreconciled(ctx, st, fmt.Errorf("%w: %q is not in Config.Flows", ErrUnknownFlow, rec.Flow))
	}
	phase, ok := flow.phaseIndex(rec.ForeignMark)
	if !ok {
		return r.leaveUnreconciled(ctx, st, fmt.Errorf("%w: the foreign mark names %q, which flow %q does not have", ErrUnknownRecoveryPoint, rec.ForeignMark, flow.Name()))
	}
	if st.input, err = flow.decode(rec.Params); err != nil {
		return r.leaveUnreconciled(ctx, st, err)
	}
	ctx, release := r.holdLease(ctx, st)
	defer release()

	st.beginAttempt(phase, 1)
	st.foreignMarked = true
	name, _, iso := flow.phaseMeta(phase)
	if iso == "" {
		iso = r.config.Isolation
	}
	verdict, result, err := r.runReconcileHook(ctx, st, iso)
	ev := st.event(EventReconciled, err)
	ev.Verdict = verdict.String()
	r.emit(ctx, ev)
	if err != nil {
		return r.leaveUnreconciled(ctx, st, err)
	}
	r.log.InfoContext(ctx, "idem: reconciled", "flow", flow.Name(), "key", key, "phase", name, "verdict", verdict)
	switch {
	case verdict == verdictNotDone:
		return r.drive(ctx, st, phase, true)
	case result.Responds():
		return &Outcome{Kind: OutcomeExecuted, Response: result.response, Record: st.rec.clone(), TookOver: true}, nil
	default:
		return r.drive(ctx, st, phase+1, true)
	}
}

// runReconcileHook runs the hook in its own transaction and, for done and
// not-done verdicts, commits the resolution guarded by the fence.
func (r *Runner) runReconcileHook(ctx context.Context, st *runState, iso pgx.TxIsoLevel) (verdict, Result, error) {
	tx, err := r.store.BeginPhase(ctx, iso)
	if err != nil {
		return verdictUnknown, Result{}, err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	var rec Reconciliation
	func() {
		defer func() {
			if v := recover(); v != nil {
				err = &PanicError{Value: v}
			}
		}()
		rec, err = st.flow.callReconcile(ctx, tx, st)
	}()
	if err != nil {
		return verdictUnknown, Result{}, fmt.Errorf("reconcile hook of phase %q: %w", st.phaseName(), err)
	}
	cp := CommitParams{Ref: st.ref, Status: StatusRunning, Lease: r.config.Lease, Retention: st.flow.retentionOr(r.config.Retention), Now: r.now()}
	switch rec.verdict {
	case verdictUnknown:
		reason := rec.reason
		if reason == "" {
			reason = "the reconcile hook could not tell"
		}
		return verdictUnknown, Result{}, errors.New(reason)
	case verdictNotDone:
		cp.RecoveryPoint = st.rec.RecoveryPoint
		cp.CheckpointPatch = nil
	case verdictDone:
		res := rec.result
		if res.err != nil {
			return verdictUnknown, Result{}, res.err
		}
		cp.CheckpointPatch = st.patch
		switch {
		case res.Responds():
			cp.RecoveryPoint, cp.Status, cp.Response = RecoveryPointFinished, StatusFinished, storableResponse(res.response)
			st.leaseEnded.Store(true)
		case st.phase == len(st.flow.PhaseNames())-1:
			return verdictUnknown, Result{}, fmt.Errorf("reconcile hook of phase %q, the last, said done without a response", st.phaseName())
		default:
			cp.RecoveryPoint = st.phaseName()
		}
	}
	started := time.Now()
	if err := r.store.CommitPhase(ctx, tx, cp); err != nil {
		return verdictUnknown, Result{}, err
	}
	committed = true
	st.committed(cp)
	if rec.verdict == verdictDone {
		// The hook committed the phase in its stead.
		r.emit(ctx, Event{Kind: EventPhaseCommitted, Flow: st.flow.Name(), Scope: st.rec.Scope, Key: st.rec.Key,
			Phase: st.phaseName(), Attempt: st.attempt, Duration: time.Since(started)})
	}
	return rec.verdict, rec.result, nil
}

// leaveUnreconciled puts a claimed key back in needs-reconcile, unlocked,
// recording why.
func (r *Runner) leaveUnreconciled(ctx context.Context, st *runState, cause error) (*Outcome, error) {
	out, err := r.toNeedsReconcile(ctx, st, cause.Error(), true)
	if errors.Is(err, ErrNeedsReconcile) {
		// Keep the cause in the chain (errors.Is) without repeating its text.
		err = fmt.Errorf("%w: key %q: %w", ErrNeedsReconcile, st.rec.Key, cause)
	}
	return out, err
}

func outcomeOfStatus(s Status) OutcomeKind {
	switch s {
	case StatusFinished:
		return OutcomeReplayed
	case StatusNeedsReconcile:
		return OutcomeNeedsReconcile
	}
	return OutcomeInProgress
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
