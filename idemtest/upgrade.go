package idemtest

import (
	"context"
	"slices"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/hooks"
)

// upgradeKinds are the faults an upgrade scenario puts in the previous
// definition's first attempt: a process that dies there and is replaced by
// the new release.
var upgradeKinds = []Kind{CrashBeforeCommit, CrashAfterForeign, CrashAfterCommit}

// runUpgrades checks Config.PreviousFlow against Config.Flow: the static
// check, then one upgrade scenario per crash kind at each phase of the
// previous definition that its first attempt reaches.
func (x *explorer[In]) runUpgrades(ctx context.Context) []*Scenario {
	check := x.newScenario(ctx, "flow change", "", "", "idem.CheckFlowChange from the previous definition to this one")
	if err := idem.CheckFlowChange(x.cfg.PreviousFlow, x.cfg.Flow); err != nil {
		check.violate("the change breaks keys the previous definition leaves in flight: %v", err)
	}
	out := []*Scenario{check.report}
	for _, phase := range x.cfg.PreviousFlow.PhaseNames() {
		for _, kind := range upgradeKinds {
			if !slices.Contains(x.cfg.Kinds, kind) {
				continue
			}
			if sc := x.runUpgrade(ctx, kind, phase); sc != nil {
				out = append(out, sc)
			}
		}
	}
	return out
}

// runUpgrade is one upgrade scenario, or nil when the previous definition's
// first attempt never reaches the fault (a phase without a foreign call, or
// off the input's path).
func (x *explorer[In]) runUpgrade(ctx context.Context, kind Kind, phase string) *Scenario {
	sc := x.newScenario(ctx, "upgrade:"+string(kind)+"@"+phase, kind, phase,
		"the previous definition "+kind.describe(phase, "")+"; every retry runs the current one")
	defer sc.end()
	f := &fault{kind: kind, phase: phase}
	w := sc.newWorker(f)
	cfg := x.runnerConfig(w, sc.clock.Now)
	cfg.Flows = slices.DeleteFunc(cfg.Flows, func(fl idem.AnyFlow) bool { return fl.Name() == x.cfg.Flow.Name() })
	cfg.Flows = append(cfg.Flows, x.cfg.PreviousFlow)
	r, err := idem.NewRunner(x.store, cfg)
	if err != nil {
		sc.violate("could not make a runner for the previous definition: %v", err)
		return sc.report
	}
	res, err := r.Execute(withScenario(ctx, sc.report.Key), x.cfg.PreviousFlow,
		idem.Request{Scope: sc.scope, Key: sc.report.Key, Path: x.cfg.Path, Params: inputOf[In](sc)})
	if res == nil {
		res = &idem.Outcome{Kind: idem.OutcomeFailed}
	}
	if !f.fired {
		return nil
	}
	sc.workerStep(w.n, w.describe(opRunPrevious, outcomeText(res, err)))
	final := x.settle(ctx, sc, res, err)
	x.renamePhases(sc)
	if final != nil {
		x.verify(ctx, sc, final)
	}
	return sc.report
}

// renamePhases records what the previous definition's phases did under the
// names the current definition gives them (Phase.FormerNames), so that a
// phase's commits and foreign calls before and after the upgrade count as
// one phase's.
func (x *explorer[In]) renamePhases(sc *scenario) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.upgrade = true
	current := func(p string) string {
		if n, ok := hooks.CurrentName(x.cfg.Flow, p); ok {
			return n
		}
		return p
	}
	commits, order := map[string]int{}, []string(nil)
	for _, p := range sc.order {
		n := current(p)
		if commits[n] == 0 {
			order = append(order, n)
		}
		commits[n] += sc.commits[p]
	}
	sc.commits, sc.order = commits, order
	for i := range sc.calls {
		sc.calls[i].phase = current(sc.calls[i].phase)
	}
}
