// Driving a held key: phase after phase from its recovery point, each in
// its fenced transaction (body.go), to the phase that responds.

package idem

import (
	"cmp"
	"context"
	"fmt"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/hooks"
	"github.com/jackc/pgx/v5"
)

// phaseOptions are the options of a phase transaction at iso (empty: the
// runner's default).
func (r *Runner) phaseOptions(iso pgx.TxIsoLevel) idemdriver.PhaseOptions {
	return idemdriver.PhaseOptions{Isolation: cmp.Or(iso, r.config.Isolation), StatementTimeout: r.config.PhaseStatementTimeout}
}

// resume drives a key this call holds the lock on from its recovery point.
func (r *Runner) resume(ctx context.Context, h *held) (*Outcome, error) {
	ctx, release := r.holdLease(ctx, h)
	defer release()

	if h.rec.ForeignMark != "" {
		// A not-idempotent call may have happened without its phase
		// committing: never re-run it blindly.
		return r.toNeedsReconcile(ctx, h, fmt.Sprintf("phase %q may have made its foreign call without committing", h.rec.ForeignMark))
	}
	from, err := h.nextPhase()
	if err != nil {
		return r.fail(ctx, h, err)
	}
	return r.drive(ctx, h, from)
}

// drive runs phases from index from until one responds: each transaction
// from its first phase through the phases that join it.
func (r *Runner) drive(ctx context.Context, h *held, from int) (*Outcome, error) {
	for i := from; i < len(h.flow.PhaseNames()); i = h.phase + 1 {
		h.enterPhase(i)
		res, err := r.runBody(ctx, h, r.phaseBody(h))
		if err != nil {
			return r.fail(ctx, h, err)
		}
		if res.Responds() {
			return h.outcome(res.response), nil
		}
	}
	// Unreachable: the last phase is made to respond before it commits.
	return r.fail(ctx, h, fmt.Errorf("%w: flow %q ran out of phases", ErrPhaseFailed, h.flow.Name()))
}

// phaseBody is the body of the held key's current transaction: the Do of
// its first phase and of each phase that joins it (Phase.JoinPrevious), in
// order, until one responds or the next does not join; then the commit the
// last one's result asks for. Each joined phase starts and ends at the test
// hooks as a phase of its own, so the crash kit can stop between them.
func (r *Runner) phaseBody(h *held) body {
	return func(ctx context.Context, tx Tx) (Result, *idemdriver.CommitParams, error) {
		for {
			res, err := h.flow.callDo(ctx, tx, h)
			if err != nil {
				return res, nil, err
			}
			if res.err != nil {
				return res, nil, fmt.Errorf("phase %q built its response: %w", h.phaseName(), res.err)
			}
			if !res.Responds() && h.phase == len(h.flow.PhaseNames())-1 {
				return res, nil, fmt.Errorf("phase %q is the last of flow %q and must respond, not advance", h.phaseName(), h.flow.Name())
			}
			if res.Responds() {
				res.response = storableResponse(res.response)
				return res, r.commitFor(h, res), nil
			}
			if !h.flow.joinsPrevious(h.phase + 1) {
				return res, r.commitFor(h, res), nil
			}
			// The phase's work is done and its commit is the next phase's.
			if err := r.hook(ctx, h, hooks.BeforeCommit); err != nil {
				return res, nil, err
			}
			h.phase++
			if err := r.hook(ctx, h, hooks.PhaseStart); err != nil {
				return res, nil, err
			}
		}
	}
}

// commitFor is what a phase (or a reconcile hook speaking for it) that ended
// with res records on the key.
func (r *Runner) commitFor(h *held, res Result) *idemdriver.CommitParams {
	cp := &idemdriver.CommitParams{
		Ref:             h.ref,
		Flow:            h.rec.Flow,
		Generation:      h.rec.Generation,
		RecoveryPoint:   h.phaseName(),
		Status:          idemtype.StoredRunning,
		CheckpointPatch: h.patch,
		Retention:       r.config.Retention,
		Now:             r.now(),
	}
	if h.flow != nil { // nil: an operator resolves a key of a flow this runner does not know
		cp.Retention = h.flow.retentionOr(cp.Retention)
	}
	if res.Responds() {
		cp.RecoveryPoint, cp.Status, cp.Response = idemtype.RecoveryPointFinished, idemtype.StoredFinished, res.response
	}
	return cp
}
