package idemtest

import (
	"errors"
	"fmt"
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
	// Scenarios are the fault scenarios, in the order they ran. Empty when
	// the baseline failed, since there is then nothing to compare with.
	Scenarios []*Scenario
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
	// Name is "kind@phase", or "baseline".
	Name  string
	Kind  Kind
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

// Failed returns the failed scenarios, the baseline first if it failed.
func (r *Report) Failed() []*Scenario {
	var out []*Scenario
	if r.Baseline != nil && r.Baseline.Failed() {
		out = append(out, r.Baseline)
	}
	for _, s := range r.Scenarios {
		if s.Failed() {
			out = append(out, s)
		}
	}
	return out
}

// Summary is a one-line account: how many scenarios ran over which phases,
// how many failed, how long it took.
func (r *Report) Summary() string {
	if r.Baseline != nil && r.Baseline.Failed() {
		return fmt.Sprintf("idemtest: flow %q: the uninterrupted baseline run failed, so no scenario ran, in %s", r.Flow, r.Elapsed.Round(time.Millisecond))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "idemtest: flow %q: %s over %s (%d with a foreign call), %d failed, in %s",
		r.Flow, plural(len(r.Scenarios), "scenario"), plural(len(r.Phases), "phase"), len(r.ForeignPhases), len(r.Failed()), r.Elapsed.Round(time.Millisecond))
	if len(r.Unreached) > 0 {
		fmt.Fprintf(&b, "; not on this input's path, so not explored: %s", strings.Join(r.Unreached, ", "))
	}
	return b.String()
}

// Err returns nil when every scenario passed; otherwise an error whose
// message is the account of the first failed scenario and the names of the
// others.
func (r *Report) Err() error {
	failed := r.Failed()
	if len(failed) == 0 {
		return nil
	}
	var b strings.Builder
	if failed[0] == r.Baseline {
		fmt.Fprintf(&b, "idemtest: flow %q: the uninterrupted baseline run failed, so no scenario ran:\n\n", r.Flow)
	} else {
		fmt.Fprintf(&b, "idemtest: flow %q: %d of %d scenarios failed. The first:\n\n", r.Flow, len(failed), len(r.Scenarios))
	}
	b.WriteString(failed[0].String())
	if len(failed) > 1 {
		names := make([]string, 0, len(failed)-1)
		for _, s := range failed[1:] {
			names = append(names, s.Name)
		}
		fmt.Fprintf(&b, "also failed: %s\n", strings.Join(names, ", "))
	}
	return errors.New(strings.TrimRight(b.String(), "\n"))
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
