package idem

import (
	"context"
	"fmt"
	"slices"
)

// Unresumable is a recovery point of a registered flow at which unfinished
// keys wait that this binary cannot resume: the flow no longer has the
// phase (renamed or removed without Phase.FormerNames or
// FlowConfig.RetiredPhases), or nothing is left to run after it. A retry of
// such a key fails with ErrUnknownRecoveryPoint. [Runner.CheckResumable]
// reports them.
type Unresumable struct {
	Flow          string `json:"flow"`
	RecoveryPoint string `json:"recovery_point"`
	// Keys counts the keys at the recovery point; NeedsReconcile those of
	// them in needs_reconcile.
	Keys           int `json:"keys"`
	NeedsReconcile int `json:"needs_reconcile"`
}

// CheckResumable looks for unfinished keys of the flows in Config.Flows that
// this binary cannot resume, because a deploy changed the flow under them
// without declaring it (docs/flows.md). Each recovery point found is logged
// as an error, emitted as EventUnresumable (Phase: the recovery point,
// Count: its keys), and returned. Run it when a release starts (the
// Maintainer does, once), and before removing a FormerNames or
// RetiredPhases entry: an empty answer means no key needs it any more. It
// reads only unfinished keys, in one statement.
func (r *Runner) CheckResumable(ctx context.Context) ([]Unresumable, error) {
	flows := r.flowNames()
	if len(flows) == 0 {
		return nil, nil
	}
	qctx, cancel := r.storeContext(ctx)
	groups, err := r.store.UnfinishedKeys(qctx, flows)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("check resumable: %w", r.storeError(ctx, err))
	}
	var stuck []Unresumable
	for _, g := range groups {
		flow, ok := r.flows[g.Flow]
		if !ok {
			continue
		}
		if next, ok := flow.resumeAt(g.RecoveryPoint); ok && next < len(flow.PhaseNames()) {
			continue
		}
		i := slices.IndexFunc(stuck, func(u Unresumable) bool { return u.Flow == g.Flow && u.RecoveryPoint == g.RecoveryPoint })
		if i < 0 {
			i = len(stuck)
			stuck = append(stuck, Unresumable{Flow: g.Flow, RecoveryPoint: g.RecoveryPoint})
		}
		stuck[i].Keys += g.Keys
		if g.Status == StatusNeedsReconcile {
			stuck[i].NeedsReconcile += g.Keys
		}
	}
	for _, u := range stuck {
		r.log.ErrorContext(ctx, "idem: unfinished keys wait at a recovery point this binary cannot resume; declare the change (Phase.FormerNames, FlowConfig.RetiredPhases) or run the release that has it",
			"flow", u.Flow, "recovery_point", u.RecoveryPoint, "keys", u.Keys, "needs_reconcile", u.NeedsReconcile)
		r.emit(ctx, Event{Kind: EventUnresumable, Flow: u.Flow, Phase: u.RecoveryPoint, Count: u.Keys})
	}
	return stuck, nil
}
