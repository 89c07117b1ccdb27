package idem

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// RecoveryPointKeys counts the unfinished keys of a registered flow at one
// recovery point; NeedsReconcile counts those of them in needs_reconcile.
type RecoveryPointKeys struct {
	Flow           string `json:"flow"`
	RecoveryPoint  string `json:"recovery_point"`
	Keys           int    `json:"keys"`
	NeedsReconcile int    `json:"needs_reconcile"`
}

// ResumeReport is what [Runner.CheckResumable] found.
type ResumeReport struct {
	// Unresumable are keys this binary cannot resume: the flow no longer
	// has their recovery point (a phase renamed or removed without
	// Phase.FormerNames or FlowConfig.RetiredPhases), or nothing is left to
	// run after it. A retry of such a key fails with
	// ErrUnknownRecoveryPoint. A key in needs_reconcile whose call in doubt
	// this binary can settle is not counted: the verdict moves it on.
	Unresumable []RecoveryPointKeys `json:"unresumable"`
	// Declared are keys this binary resumes only through a declaration: a
	// recovery point that is a former name or a retired phase, or a call in
	// doubt marked under a former name (RecoveryPoint then names the
	// mark). The declarations they use must stay until none is left.
	Declared []RecoveryPointKeys `json:"declared"`
}

// CheckResumable looks at the unfinished keys of the flows in Config.Flows
// against this binary's definitions of them (docs/flows.md). Each recovery
// point it cannot resume is logged as an error and emitted as
// EventUnresumable (Phase: the recovery point, Count: its keys). Run it when
// a release starts (the Maintainer does, once); before a deploy that drops
// a FormerNames or RetiredPhases entry, its Declared list says which
// entries keys still need (a renamed phase's oldest name stays anyway: it
// derives the phase's downstream keys). It reads only unfinished keys, in
// one statement.
func (r *Runner) CheckResumable(ctx context.Context) (*ResumeReport, error) {
	flows := r.flowNames()
	if len(flows) == 0 {
		return &ResumeReport{}, nil
	}
	qctx, cancel := r.storeContext(ctx)
	groups, err := r.store.UnfinishedKeys(qctx, flows)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("check resumable: %w", r.storeError(ctx, err))
	}
	rep := &ResumeReport{}
	for _, g := range groups {
		flow, ok := r.flows[g.Flow]
		if !ok {
			continue
		}
		settles := false
		if g.Mark != "" {
			if i, ok := flow.phaseIndex(g.Mark); ok {
				settles = flow.reconcilable(i)
				if flow.PhaseNames()[i] != g.Mark {
					rep.Declared = countKeys(rep.Declared, g.Flow, g.Mark, g)
				}
			}
		}
		next, ok := flow.resumeAt(g.RecoveryPoint)
		switch {
		case (!ok || next >= len(flow.PhaseNames())) && !settles:
			rep.Unresumable = countKeys(rep.Unresumable, g.Flow, g.RecoveryPoint, g)
		case ok && g.RecoveryPoint != idemtype.RecoveryPointStarted && !slices.Contains(flow.PhaseNames(), g.RecoveryPoint):
			rep.Declared = countKeys(rep.Declared, g.Flow, g.RecoveryPoint, g)
		}
	}
	for _, u := range rep.Unresumable {
		r.log.ErrorContext(ctx, "idem: unfinished keys wait at a recovery point this binary cannot resume; declare the change (Phase.FormerNames, FlowConfig.RetiredPhases) or run the release that has it",
			"flow", u.Flow, "recovery_point", u.RecoveryPoint, "keys", u.Keys, "needs_reconcile", u.NeedsReconcile)
		r.emit(ctx, Event{Kind: EventUnresumable, Flow: u.Flow, Phase: u.RecoveryPoint, Count: u.Keys})
	}
	return rep, nil
}

// countKeys adds group g's keys to the entry of flow and point in list.
func countKeys(list []RecoveryPointKeys, flow, point string, g idemdriver.UnfinishedKeys) []RecoveryPointKeys {
	i := slices.IndexFunc(list, func(k RecoveryPointKeys) bool { return k.Flow == flow && k.RecoveryPoint == point })
	if i < 0 {
		i = len(list)
		list = append(list, RecoveryPointKeys{Flow: flow, RecoveryPoint: point})
	}
	list[i].Keys += g.Keys
	if g.Status == idemtype.StoredNeedsReconcile {
		list[i].NeedsReconcile += g.Keys
	}
	return list
}
