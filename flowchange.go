package idem

import (
	"errors"
	"fmt"
	"slices"
)

// ErrUnsafeFlowChange is wrapped by the error CheckFlowChange returns.
var ErrUnsafeFlowChange = errors.New("idem: unsafe flow change")

// CheckFlowChange compares a flow's previous definition (the one the running
// release has) with its next one and reports every change that would break
// a key the previous release left in flight:
//
//   - a recovery point of the previous definition (a phase, a former name, a
//     retired phase) that the next one cannot resume: a renamed phase must
//     list its old name in Phase.FormerNames, a removed one must be in
//     FlowConfig.RetiredPhases;
//   - a phase whose downstream identity changes (its oldest name; see
//     Phase.FormerNames): a request interrupted mid-call would send the
//     provider a new downstream key, and be charged twice;
//   - a not-idempotent phase that is gone, or that is no longer
//     not-idempotent: a key whose call is in doubt there could not be
//     settled (no Reconcile hook to ask).
//
// Adding a phase at the end, or inserting one, is reported by nothing: keys
// before the new phase run it, keys past it never do (docs/flows.md). Run it
// in a test with the previous definition kept beside the new one (the
// crash kit does, with idemtest.Config.PreviousFlow), and remove the
// declarations a change needed only once no key is left at the old names
// (Runner.CheckResumable reports those in a database).
func CheckFlowChange(prev, next AnyFlow) error {
	if prev.Name() != next.Name() {
		return fmt.Errorf("%w: flow %q is not flow %q: keys belong to a flow by its name", ErrUnsafeFlowChange, next.Name(), prev.Name())
	}
	var problems []error
	problem := func(format string, args ...any) {
		problems = append(problems, fmt.Errorf("%w: flow %q: %s", ErrUnsafeFlowChange, next.Name(), fmt.Sprintf(format, args...)))
	}
	points := prev.recoveryPoints()
	slices.Sort(points)
	for _, point := range points {
		switch i, ok := next.resumeAt(point); {
		case !ok:
			problem("a key at %q cannot resume: name it in FormerNames of the phase it became, or in RetiredPhases if the phase is gone", point)
		case i >= len(next.PhaseNames()):
			problem("a key at %q would have no phase left to run: the phase after it responded, and is gone", point)
		default:
			// Where it resumes must keep the order: what the key has run
			// stays behind it, what it has yet to run stays ahead.
			from, _ := prev.resumeAt(point)
			for k, name := range prev.PhaseNames() {
				switch j, ok := next.phaseIndex(name); {
				case !ok:
				case k < from && j >= i:
					problem("a key at %q has committed %q, which the next definition would run again", point, name)
				case k >= from && j < i:
					problem("a key at %q has yet to run %q, which the next definition would skip", point, name)
				}
			}
		}
	}
	for i, name := range prev.PhaseNames() {
		_, kind, _ := prev.phaseMeta(i)
		if kind == ForeignNotIdempotent {
			// A mark names the phase by the name it had when the call was
			// made: each must still find a phase with a hook.
			for _, mark := range prev.namesOf(i) {
				if j, ok := next.phaseIndex(mark); !ok || !next.reconcilable(j) {
					problem("phase %q makes a not-idempotent call, and a key in doubt marked at %q could not be settled: keep a phase with that name (or former name) and its Reconcile hook until no key is marked at it", name, mark)
				}
			}
		}
		j, ok := next.phaseIndex(name)
		if !ok {
			continue
		}
		nextName, _, _ := next.phaseMeta(j)
		if was, is := prev.downstreamName(i), next.downstreamName(j); was != is {
			problem("phase %q (now %q) would send other downstream keys (derived from %q, was %q): list its oldest name first in FormerNames", name, nextName, is, was)
		}
	}
	return errors.Join(problems...)
}
