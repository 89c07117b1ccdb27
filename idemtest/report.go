package idemtest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Report is what an exploration did: the baseline, every scenario and its
// account.
type Report struct {
	// Flow is the explored flow's name.
	Flow string
	// Baseline is the uninterrupted run every scenario is compared with.
	Baseline *Scenario
	// Scenarios are the fault scenarios, in the order they ran: those at
	// each phase, then the wire scenarios (their Kind.Wire is true). Empty
	// when the baseline failed, since there is then nothing to compare
	// with.
	Scenarios []*Scenario
	// WireBaseline is the uninterrupted run through the fault proxy that
	// counted the request's round trips; nil when no wire scenario kind
	// was explored. The wire scenarios run only when it passed.
	WireBaseline *Scenario
	// RoundTrips is how many round trips to Postgres the request made in
	// the wire baseline: one wire scenario of each wire kind per round
	// trip.
	RoundTrips int
	// Phases are the flow's phases the input's path went through, in order;
	// ForeignPhases those that made a foreign call.
	Phases, ForeignPhases []string
	// Unreached are the flow's phases the input's path never entered, so
	// no crash point there was explored.
	Unreached []string
	// Elapsed is the wall time of the whole exploration.
	Elapsed time.Duration
}

// Scenario is one run of the flow on a fresh key: a fault, the retries that
// followed until a final outcome, and what was checked.
type Scenario struct {
	// Name is "kind@phase", "kind@N" for a wire scenario at round trip N,
	// "baseline" or "wire_baseline".
	Name string
	Kind Kind
	// Phase is the phase the fault hits; for a wire scenario, the phase
	// its round trip belongs to, if any.
	Phase string
	// Description says in a sentence what the scenario does.
	Description string
	// Key is the idempotency key the scenario used, in the Config's scope;
	// look it up in idem_keys when a failure needs digging into.
	Key string
	// Steps is what happened, in order: each worker's call and its outcome,
	// each clock jump.
	Steps []string
	// Violations are the invariants the scenario broke; empty when it
	// passed.
	Violations []string
	// RanAlone is set on a wire scenario that failed while other wire
	// scenarios ran beside it and was then run again, alone, on another
	// key: scenarios share the flow's tables, and a stalled one holds its
	// row locks until its worker answers, so the others may wait on them
	// past WireTimeout. The scenario is held to its run alone; Steps tell
	// both runs.
	RanAlone bool
	// Missed is set on a wire scenario whose round trip never came: its
	// request made fewer round trips than the wire baseline's, along the
	// same phases, so the fault had nothing to break. Its invariants were
	// checked all the same.
	Missed bool

	// ended orders the scenarios by when they ended (wire scenarios end
	// in another order than they start).
	ended int64
}

// Failed reports whether the scenario broke an invariant.
func (s *Scenario) Failed() bool { return len(s.Violations) > 0 }

// String is the scenario's account: what it did, what happened, and what it
// violated.
func (s *Scenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s: %s\n", s.Name, s.Description)
	fmt.Fprintf(&b, "key %q\n", s.Key)
	b.WriteString("what happened:\n")
	for i, step := range s.Steps {
		fmt.Fprintf(&b, "  %d. %s\n", i+1, step)
	}
	if s.Failed() {
		b.WriteString("violated:\n")
		for _, v := range s.Violations {
			fmt.Fprintf(&b, "  - %s\n", v)
		}
	}
	return b.String()
}

// Failed returns the failed scenarios in the order they failed (ended),
// the baseline first if it failed.
func (r *Report) Failed() []*Scenario {
	var out, scenarios []*Scenario
	if r.Baseline != nil && r.Baseline.Failed() {
		out = append(out, r.Baseline)
	}
	if r.WireBaseline != nil && r.WireBaseline.Failed() {
		out = append(out, r.WireBaseline)
	}
	for _, s := range r.Scenarios {
		if s.Failed() {
			scenarios = append(scenarios, s)
		}
	}
	slices.SortStableFunc(scenarios, func(a, b *Scenario) int { return cmp.Compare(a.ended, b.ended) })
	return append(out, scenarios...)
}

// Summary is a one-line account: how many scenarios ran over which phases,
// how many wire scenarios over how many round trips, how many failed, how
// long it took.
func (r *Report) Summary() string {
	if r.Baseline != nil && r.Baseline.Failed() {
		return fmt.Sprintf("idemtest: flow %q: the uninterrupted baseline run failed, so no scenario ran, in %s", r.Flow, r.Elapsed.Round(time.Millisecond))
	}
	phased, wire, missed, alone := 0, 0, 0, 0
	for _, s := range r.Scenarios {
		if s.RanAlone {
			alone++
		}
		switch {
		case !s.Kind.Wire():
			phased++
		case s.Missed:
			missed++
			fallthrough
		default:
			wire++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "idemtest: flow %q: %s over %s (%d with a foreign call)",
		r.Flow, plural(phased, "scenario"), plural(len(r.Phases), "phase"), len(r.ForeignPhases))
	switch {
	case r.WireBaseline == nil:
	case r.WireBaseline.Failed():
		b.WriteString(" and no wire scenario (the run through the fault proxy failed)")
	default:
		fmt.Fprintf(&b, " and %s over %s", plural(wire, "wire scenario"), plural(r.RoundTrips, "round trip"))
		if missed > 0 {
			fmt.Fprintf(&b, " (%d found fewer round trips and broke nothing)", missed)
		}
		if alone > 0 {
			fmt.Fprintf(&b, " (%d failed beside others and ran again alone)", alone)
		}
	}
	fmt.Fprintf(&b, ", %d failed, in %s", len(r.Failed()), r.Elapsed.Round(time.Millisecond))
	if len(r.Unreached) > 0 {
		fmt.Fprintf(&b, "; not on this input's path, so not explored: %s", strings.Join(r.Unreached, ", "))
	}
	return b.String()
}

// Err returns nil when every scenario passed; otherwise an error whose
// message is the account of the first failed scenario, the names of the
// others, and then their accounts, in the order they failed.
func (r *Report) Err() error {
	failed := r.Failed()
	if len(failed) == 0 {
		return nil
	}
	var b strings.Builder
	switch failed[0] {
	case r.Baseline:
		fmt.Fprintf(&b, "idemtest: flow %q: the uninterrupted baseline run failed, so no scenario ran:\n\n", r.Flow)
	case r.WireBaseline:
		fmt.Fprintf(&b, "idemtest: flow %q: the uninterrupted run through the fault proxy failed, so no wire scenario ran:\n\n", r.Flow)
	default:
		fmt.Fprintf(&b, "idemtest: flow %q: %d of %d scenarios failed. The first:\n\n", r.Flow, len(failed), len(r.Scenarios))
	}
	b.WriteString(failed[0].String())
	if len(failed) > 1 {
		names := make([]string, 0, len(failed)-1)
		for _, s := range failed[1:] {
			names = append(names, s.Name)
		}
		fmt.Fprintf(&b, "also failed: %s\n", strings.Join(names, ", "))
		for i, s := range failed[1:] {
			fmt.Fprintf(&b, "\nfailure %d of %d:\n%s", i+2, len(failed), s.String())
		}
	}
	return errors.New(strings.TrimRight(b.String(), "\n"))
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
