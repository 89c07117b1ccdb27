package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// ResolveVerdict is an operator's verdict on a key in needs_reconcile, for
// [Runner.Resolve].
type ResolveVerdict string

const (
	// ResolveHappened: the foreign call in doubt took effect. The phase is
	// committed in its stead and the key resumes at the next phase on its
	// client's retry or the completer's next pass, as after a reconcile
	// verdict of happened; or, with Resolution.Response, the key is finished with
	// that answer, which every retry replays.
	ResolveHappened ResolveVerdict = "happened"
	// ResolveNotHappened: the call did not take effect. Its mark is cleared
	// and the key released, so the phase runs again on the next retry or
	// completer pass, as after a reconcile verdict of not happened.
	ResolveNotHappened ResolveVerdict = "not_happened"
	// ResolveAbandon: give the request up, whatever the call did. The key is
	// finished; every retry with it gets ErrRequestAbandoned
	// (OutcomeRequestAbandoned, HTTP problem request-abandoned) and nothing
	// runs again.
	ResolveAbandon ResolveVerdict = "abandon"
)

// ParseResolveVerdict parses a verdict as the CLI accepts it ("not-happened"
// for ResolveNotHappened too).
func ParseResolveVerdict(s string) (ResolveVerdict, error) {
	switch v := ResolveVerdict(strings.ReplaceAll(s, "-", "_")); v {
	case ResolveHappened, ResolveNotHappened, ResolveAbandon:
		return v, nil
	}
	return "", fmt.Errorf("%w: verdict %q: want happened, not_happened or abandon", ErrInvalidRequest, s)
}

// Resolution is an operator's verdict on a key, for [Runner.Resolve].
type Resolution struct {
	Verdict ResolveVerdict
	// Response, with ResolveHappened only, finishes the key with this
	// answer (as the flow would have responded) instead of resuming it:
	// for a call that took effect at the last phase, or whose later phases
	// should not run. Its Status must be 200-599.
	Response *idemtype.Response
	// Operator and Reason say who gave the verdict and why (a ticket, what
	// the provider's dashboard showed). Both are required, and Reason must
	// say something: at least MinReasonWords words and MinReasonChars
	// characters. They are logged, recorded as the key's last error and, for
	// good, in the key's verdicts (Runner.Verdicts), with the database role
	// and client address of the session that applied the verdict.
	Operator, Reason string
	// ConfirmRerun acknowledges that ResolveNotHappened on a key whose
	// not-idempotent call is in doubt makes that call again: if it did
	// happen after all, it happens twice (a charge is charged twice).
	// Without it such a verdict is refused with ErrRerunNotConfirmed, the
	// key unchanged; a dry run says what it would do either way.
	ConfirmRerun bool
	// DryRun checks the key and says what would be done, changing nothing.
	DryRun bool
}

// MinReasonWords and MinReasonChars are the least a Resolution's Reason
// must hold (after trimming space): a verdict outlives its key, and "x"
// tells whoever reads it a year later nothing.
const (
	MinReasonWords = 3
	MinReasonChars = 15
)

// ErrRerunNotConfirmed is returned by [Runner.Resolve] for
// ResolveNotHappened on a key whose not-idempotent call is in doubt
// without Resolution.ConfirmRerun: the call would be made again. Its
// text says which call.
var ErrRerunNotConfirmed = errors.New("idem: the verdict not happened makes the call in doubt again; it needs confirming")

// ResolveResult is what [Runner.Resolve] did, or would do.
type ResolveResult struct {
	// Record is the key: as found for a dry run, as left otherwise.
	Record *idemtype.KeyRecord `json:"key"`
	// Verdict is the verdict given.
	Verdict ResolveVerdict `json:"verdict"`
	// Action says in words what was (or, for a dry run, would be) done.
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
}

// AbandonedStatus is the status stored with a key whose request an operator
// abandoned: a placeholder the finished key must carry (a retry gets
// ErrRequestAbandoned, not a replay of it), and what an older binary that
// does not know abandoned keys replays.
const AbandonedStatus = http.StatusGone

// Resolve gives an operator's verdict on a key in StoredNeedsReconcile whose
// reconcile hook keeps answering unknown, or that has no hook: its
// not-idempotent call happened (the key resumes at the next phase, or is
// finished with a stored answer), did not happen (the phase runs again), or
// the request is abandoned (retries get ErrRequestAbandoned). See
// [ResolveVerdict].
//
// Resolve claims the key as a reconcile run does, moving its fence on, so a
// worker or reconcile run that held it can no longer commit; a key someone
// holds is refused with ErrInProgress, and a key in any other state with
// ErrNothingToReconcile, the key unchanged. It runs no phase and no hook: the
// key is left unlocked for its client's retry or the completer, which need
// the flow; the flow need not be registered here, except for ResolveHappened
// without a Response, which must know the phase is not the flow's last.
// Resolution.Operator and Reason are logged and recorded as the key's last
// error. With Resolution.DryRun it only reads the key and says what it would
// do.
func (r *Runner) Resolve(ctx context.Context, scope, key string, res Resolution) (*ResolveResult, error) {
	if err := res.validate(scope, key); err != nil {
		return nil, err
	}
	gctx, cancel := r.storeContext(ctx)
	rec, err := r.store.GetKey(gctx, scope, key)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("resolve: %w", r.storeError(ctx, err))
	}
	out := &ResolveResult{Record: rec, Verdict: res.Verdict, DryRun: res.DryRun}
	if rec.Status != idemtype.StoredNeedsReconcile {
		return out, fmt.Errorf("%w: key %q is %s; only a key in needs_reconcile can be resolved", ErrNothingToReconcile, key, rec.Status)
	}
	flow := r.flows[rec.Flow]
	if out.Action, err = res.plan(rec, flow); err != nil {
		return out, err
	}
	warning := rerunWarning(res, rec)
	if warning != "" {
		out.Action += "; " + warning
	}
	if res.DryRun {
		out.Action = "would " + out.Action
		if rec.LeaseExpiresAt != nil && rec.LeaseExpiresAt.After(r.localNow()) {
			out.Action += fmt.Sprintf("; but the key is held until %s (a reconcile run or another resolve), and is refused until then",
				rec.LeaseExpiresAt.UTC().Format(time.RFC3339))
		}
		return out, nil
	}
	if warning != "" && !res.ConfirmRerun {
		return out, fmt.Errorf("%w: %s", ErrRerunNotConfirmed, warning)
	}

	cctx, cancel := r.storeContext(ctx)
	sent := r.localNow()
	acq, err := r.store.ClaimReconcile(cctx, idemdriver.ClaimParams{Scope: scope, Key: key, Lease: r.config.Lease, Now: r.now()})
	cancel()
	switch {
	case err != nil:
		return out, fmt.Errorf("resolve: claim: %w", r.storeError(ctx, err))
	case acq.Record == nil:
		return out, fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key)
	case acq.Acquired == idemdriver.AcquiredNone:
		out.Record = acq.Record
		if acq.Record.Status == idemtype.StoredNeedsReconcile {
			return out, fmt.Errorf("%w: another worker holds key %q (a reconcile run, or a resolve); try again when it lets go", ErrInProgress, key)
		}
		return out, fmt.Errorf("%w: key %q became %s", ErrNothingToReconcile, key, acq.Record.Status)
	}
	h := r.hold(flow, acq.Record, nil, true, sent)
	h.lettingGo.Store(true)
	if h.rec.ForeignMark != rec.ForeignMark || h.rec.RecoveryPoint != rec.RecoveryPoint {
		// The key moved between the read and the claim: the plan was made
		// for another state. Put it back as it is.
		_, _ = r.toNeedsReconcile(ctx, h, h.rec.LastError)
		return out, fmt.Errorf("%w: key %q changed while it was being resolved; look at it again", ErrInProgress, key)
	}
	note := fmt.Sprintf("resolved by %s: %s: %s", res.Operator, res.Verdict, res.Reason)
	v := r.verdictRecord(h, flow, res, out.Action)
	if committed, err := r.applyResolution(ctx, h, res, note, v); err != nil {
		if !committed && !errors.Is(err, ErrLockLost) {
			// Back to needs_reconcile, unlocked, with the failure recorded;
			// a commit whose reply was lost shows in the key.
			_, _ = r.toNeedsReconcile(ctx, h, r.errorText(fmt.Errorf("%s, which failed: %w", note, err)))
		}
		out.Record = h.rec.Clone()
		return out, fmt.Errorf("resolve key %q: %w", key, err)
	}
	out.Record = h.rec.Clone()
	gctx, cancel = r.storeContext(ctx)
	if rec, err := r.store.GetKey(gctx, scope, key); err == nil {
		out.Record = rec // with what the store set (expiry, finish time)
	}
	cancel()
	r.log.WarnContext(ctx, "idem: key resolved by an operator", h.logAttrs("flow", rec.Flow, "verdict", res.Verdict,
		"operator", res.Operator, "reason", res.Reason, "phase", rec.ForeignMark, "recovery_point", h.rec.RecoveryPoint, "action", out.Action,
		"verdict_id", v.ID)...)
	r.emit(ctx, Event{Kind: EventResolved, Flow: rec.Flow, Scope: scope, Key: key, Phase: rec.ForeignMark, Verdict: string(res.Verdict)})
	return out, nil
}

// rerunWarning says what ResolveNotHappened on rec makes happen when a
// not-idempotent call is in doubt there; "" for any other verdict or key.
func rerunWarning(res Resolution, rec *idemtype.KeyRecord) string {
	if res.Verdict != ResolveNotHappened || rec.ForeignMark == "" {
		return ""
	}
	return fmt.Sprintf("the call of phase %q will be made again; if it did happen, it happens twice (a charge is charged twice)", rec.ForeignMark)
}

// verdictRecord is the record of res on the claimed key h, for the
// transaction that applies it.
func (r *Runner) verdictRecord(h *held, flow AnyFlow, res Resolution, action string) *idemtype.Verdict {
	v := &idemtype.Verdict{Scope: h.rec.Scope, Key: h.rec.Key, KeyID: h.rec.ID, Generation: h.rec.Generation, Fence: h.rec.Fence,
		Flow: h.rec.Flow, Verdict: string(res.Verdict), Phase: h.rec.ForeignMark, RecoveryPoint: h.rec.RecoveryPoint,
		Operator: res.Operator, Reason: res.Reason, Action: action}
	if h.rec.ForeignMark != "" {
		// Only a not-idempotent call is marked; the flow says so too when
		// this binary has it.
		v.ForeignKind = ForeignNotIdempotent.String()
		if i, ok := flowPhase(flow, h.rec.ForeignMark); ok {
			_, kind, _ := flow.phaseMeta(i)
			v.ForeignKind = kind.String()
		}
	}
	answer := res.Response
	if res.Verdict == ResolveAbandon {
		answer = &idemtype.Response{Status: AbandonedStatus}
	}
	if answer != nil {
		status, n := answer.Status, len(answer.Body)
		v.AnswerStatus, v.AnswerBytes = &status, &n
	}
	return v
}

// flowPhase is the index of phase in flow, which may be nil.
func flowPhase(flow AnyFlow, phase string) (int, bool) {
	if flow == nil {
		return 0, false
	}
	return flow.phaseIndex(phase)
}

// Verdicts returns the operators' verdicts given on scope and key (see
// [Runner.Resolve]), oldest first: every one that was applied, over all the
// rows the key has had, including those the key's finish, its expiry and
// the reaper made it forget. The reaper never deletes them; see
// docs/operations.md, "Verdicts", for their retention.
func (r *Runner) Verdicts(ctx context.Context, scope, key string) ([]idemtype.Verdict, error) {
	gctx, cancel := r.storeContext(ctx)
	defer cancel()
	vs, err := r.store.Verdicts(gctx, scope, key)
	if err != nil {
		return nil, fmt.Errorf("verdicts: %w", r.storeError(ctx, err))
	}
	return vs, nil
}

func (res *Resolution) validate(scope, key string) error {
	var problems []string
	if scope == "" || key == "" {
		problems = append(problems, "scope and key are required")
	}
	if _, err := ParseResolveVerdict(string(res.Verdict)); err != nil {
		problems = append(problems, fmt.Sprintf("verdict %q: want happened, not_happened or abandon", res.Verdict))
	}
	reason := strings.TrimSpace(res.Reason)
	switch {
	case strings.TrimSpace(res.Operator) == "" || reason == "":
		problems = append(problems, "an operator and a reason are required")
	case len(strings.Fields(reason)) < MinReasonWords || len([]rune(reason)) < MinReasonChars:
		problems = append(problems, fmt.Sprintf("the reason %q says too little: give at least %d words and %d characters (a ticket and what the provider showed)",
			reason, MinReasonWords, MinReasonChars))
	}
	switch {
	case res.Response != nil && res.Verdict != ResolveHappened:
		problems = append(problems, "a response goes only with the verdict happened")
	case res.Response != nil && (res.Response.Status < 200 || res.Response.Status > 599):
		problems = append(problems, fmt.Sprintf("response status %d is outside 200-599", res.Response.Status))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: resolve: %s", ErrInvalidRequest, strings.Join(problems, "; "))
	}
	return nil
}

// plan checks that the verdict can be applied to rec and says what it does.
// flow is nil when this runner does not know the key's flow.
func (res *Resolution) plan(rec *idemtype.KeyRecord, flow AnyFlow) (string, error) {
	switch {
	case res.Verdict == ResolveAbandon:
		return fmt.Sprintf("finish the key as abandoned: retries get the request-abandoned problem (stored status %d)", AbandonedStatus), nil
	case res.Verdict == ResolveHappened && res.Response != nil:
		return fmt.Sprintf("finish the key with the given answer (status %d, %d bytes), replayed to every retry", res.Response.Status, len(res.Response.Body)), nil
	case rec.ForeignMark == "":
		// Nothing in doubt (a commit whose reply was lost cleared the mark):
		// either verdict resumes the key from its recovery point.
		return fmt.Sprintf("release the key (no call is in doubt) to resume after %q on the next retry or completer pass", rec.RecoveryPoint), nil
	case res.Verdict == ResolveNotHappened:
		return fmt.Sprintf("clear the mark of phase %q and release the key, so the phase runs again on the next retry or completer pass", rec.ForeignMark), nil
	case flow == nil:
		return "", fmt.Errorf("%w: %q is not a flow this binary has, so it cannot tell whether phase %q is its last (which must respond): "+
			"give the answer the flow would have stored (a response), or resolve with the application's own CLI", ErrUnknownFlow, rec.Flow, rec.ForeignMark)
	}
	i, ok := flow.phaseIndex(rec.ForeignMark)
	switch {
	case !ok:
		return "", fmt.Errorf("%w: the foreign mark names %q, which flow %q does not have", ErrUnknownRecoveryPoint, rec.ForeignMark, rec.Flow)
	case i == len(flow.PhaseNames())-1:
		return "", fmt.Errorf("%w: resolve: phase %q is the last of flow %q and must respond: give the answer it would have stored (a response)",
			ErrInvalidRequest, rec.ForeignMark, rec.Flow)
	}
	return fmt.Sprintf("commit phase %q as done and release the key, to resume at phase %q on the next retry or completer pass",
		rec.ForeignMark, flow.PhaseNames()[i+1]), nil
}

// applyResolution records the verdict on the claimed key h with the
// reconcile machinery (resolution, commitFor), in one transaction guarded by
// the fence that also withdraws the mark of a call that did not happen, and
// releases a key left unfinished.
// committed reports whether the verdict's commit landed.
func (r *Runner) applyResolution(ctx context.Context, h *held, res Resolution, note string, v *idemtype.Verdict) (committed bool, err error) {
	var cp *idemdriver.CommitParams
	switch {
	case res.Verdict == ResolveAbandon:
		placeholder := Respond(AbandonedStatus, nil, nil)
		if _, cp, err = r.resolution(h, ReconcileHappened(placeholder)); err == nil {
			cp.RecoveryPoint = idemtype.RecoveryPointAbandoned
		}
	case res.Verdict == ResolveHappened && res.Response != nil:
		_, cp, err = r.resolution(h, ReconcileHappened(Respond(res.Response.Status, res.Response.Header, res.Response.Body)))
	case res.Verdict == ResolveHappened && h.rec.ForeignMark != "":
		i, _ := h.flow.phaseIndex(h.rec.ForeignMark) // plan checked both
		h.enterPhase(i)
		_, cp, err = r.resolution(h, ReconcileHappened(Result{}))
	default: // not happened, or nothing in doubt
		if _, cp, err = r.resolution(h, ReconcileNotHappened()); err == nil {
			// The recovery point stays, so the commit does not retire the
			// mark: it withdraws it, in the verdict's transaction. Cleared
			// before, on its own, a verdict that then failed to land would
			// leave the call out of doubt, unrecorded, for any later
			// verdict to re-run unconfirmed.
			cp.ClearForeignMark = h.rec.ForeignMark != ""
		}
	}
	if err != nil {
		return false, err
	}
	if cp.Status == idemtype.StoredFinished {
		cp.LastError = note
	}
	if err := r.commitResolution(ctx, cp, v); err != nil {
		return false, err
	}
	h.committed(cp)
	if cp.Status == idemtype.StoredFinished {
		h.rec.LastError = note
		return true, nil
	}
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	if err := r.store.Release(rctx, h.ref, note); err != nil {
		return true, fmt.Errorf("the verdict is recorded, but the key could not be released (it unlocks when its lease expires): %w", r.storeError(ctx, err))
	}
	h.rec.LockedAt, h.rec.LeaseExpiresAt, h.rec.LastError = nil, nil, note
	return true, nil
}

// commitResolution records cp on its key in a transaction of its own: the
// guarded commit a phase ends with, with the verdict's record v before it,
// so that the record lands if and only if the verdict does.
func (r *Runner) commitResolution(ctx context.Context, cp *idemdriver.CommitParams, v *idemtype.Verdict) error {
	bctx, cancel := r.storeContext(ctx)
	tx, err := r.store.BeginPhase(bctx, idemdriver.PhaseOptions{Isolation: r.config.Isolation})
	cancel()
	if err != nil {
		return r.storeError(ctx, err)
	}
	cctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	if err := r.store.RecordVerdict(cctx, tx, v); err != nil {
		_ = tx.RollbackPhase(cctx)
		return r.storeError(ctx, err)
	}
	if err := tx.CommitPhase(cctx, *cp); err != nil {
		_ = tx.RollbackPhase(cctx)
		return r.storeError(ctx, err)
	}
	return nil
}
