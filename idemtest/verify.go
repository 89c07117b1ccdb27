package idemtest

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// verify checks a settled scenario's invariants.
func (x *explorer[In]) verify(ctx context.Context, sc *scenario, final *idemtype.Response) {
	sc.step("final response: %d %s", final.Status, quoteBody(final.Body))

	out, err := x.call(ctx, sc, nil, opRun, x.store)
	switch {
	case out.Kind != idem.OutcomeReplayed || out.Response == nil:
		sc.violate("a retry after the final response got %s, want a replay", outcomeText(out, err))
	case out.Response.Status != final.Status || !bytes.Equal(out.Response.Body, final.Body):
		sc.violate("the replay (%d %s) differs from the final response (%d %s)", out.Response.Status, quoteBody(out.Response.Body), final.Status, quoteBody(final.Body))
	}
	if sc.report.Name != "baseline" {
		if err := x.cfg.Compare(x.response, final); err != nil {
			sc.violate("the final response is not the uninterrupted run's: %v", err)
		}
	}

	rec, err := x.store.GetKey(ctx, sc.scope, sc.report.Key)
	switch {
	case err != nil:
		sc.violate("could not read the key: %v", err)
	case rec.Status != idemtype.StoredFinished || rec.RecoveryPoint != idemtype.RecoveryPointFinished:
		sc.violate("the key is %s at recovery point %q, want finished", rec.Status, rec.RecoveryPoint)
	case rec.ForeignMark != "" || rec.LockedAt != nil:
		sc.violate("the finished key still has a foreign mark %q or a lock (locked at %v)", rec.ForeignMark, rec.LockedAt)
	}

	x.checkCommits(sc)
	x.checkForeignCalls(sc)
	x.checkProviders(sc)

	if x.cfg.Check != nil && rec != nil {
		if err := x.cfg.Check(ctx, rec); err != nil {
			if sc.report.Name == "baseline" {
				sc.violate("Check fails on the uninterrupted run, so it or the flow is wrong before any fault: %v", err)
			} else {
				sc.violate("Check: %v", err)
			}
		}
	}
}

// checkCommits: every phase of the path committed exactly once, whether by
// the phase itself or by its reconcile hook, and no other phase did.
func (x *explorer[In]) checkCommits(sc *scenario) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.upgrade {
		// Which phases run depends on where the previous definition
		// stopped (an inserted phase runs only for keys before it), so an
		// upgrade holds each phase to at most once.
		for _, p := range sc.order {
			if n := sc.commits[p]; n > 1 {
				sc.violateLocked("phase %q committed %d times, want at most once", p, n)
			}
		}
		return
	}
	for _, p := range x.phases {
		if n := sc.commits[p]; n != 1 {
			sc.violateLocked("phase %q committed %d times, want exactly once", p, n)
		}
	}
	for _, p := range sc.order {
		if !slices.Contains(x.phases, p) {
			sc.violateLocked("phase %q committed, but the uninterrupted run never ran it", p)
		}
	}
}

// checkForeignCalls: every phase that called out in the baseline called out
// here; an idempotent call used one downstream key throughout (duplicates
// with that key are the provider's to deduplicate); no two phases shared a
// key. Repeated not-idempotent calls are caught as they happen.
func (x *explorer[In]) checkForeignCalls(sc *scenario) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	keysByPhase := map[string][]string{}
	phaseByKey := map[string]string{}
	for _, c := range sc.calls {
		if !slices.Contains(keysByPhase[c.phase], c.key) {
			keysByPhase[c.phase] = append(keysByPhase[c.phase], c.key)
		}
		if other, ok := phaseByKey[c.key]; ok && other != c.phase {
			sc.violateLocked("phases %q and %q sent the same downstream key %q", other, c.phase, c.key)
		}
		phaseByKey[c.key] = c.phase
	}
	if sc.upgrade {
		// Across an upgrade a phase may have another name: the call's own
		// name ties the calls together. Two downstream keys for one call
		// are a rename the new definition did not declare (a removed phase
		// and a new one doing its call are not a rename).
		keysByCall := map[string][]string{}
		for _, c := range sc.calls {
			if c.kind == idem.ForeignIdempotent && !slices.Contains(keysByCall[c.name], c.key) {
				keysByCall[c.name] = append(keysByCall[c.name], c.key)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(keysByCall)) {
			if keys := keysByCall[name]; len(keys) > 1 {
				sc.violateLocked("the foreign call %q went out with %d different downstream keys across the upgrade (%s): the phase making it changed its identity; list its old name in FormerNames", name, len(keys), strings.Join(keys, ", "))
			}
		}
	}
	for _, p := range x.phases {
		base, ok := x.foreign[p]
		if !ok {
			continue
		}
		keys := keysByPhase[p]
		switch {
		case len(keys) == 0 && !sc.upgrade: // an upgrade may resume past it
			sc.violateLocked("phase %q never made its foreign call %q, which the uninterrupted run made", p, base.name)
		case len(keys) > 1 && base.kind == idem.ForeignIdempotent:
			sc.violateLocked("phase %q sent its foreign call %q with %d different downstream keys (%s); the provider can only deduplicate calls that share one", p, base.name, len(keys), strings.Join(keys, ", "))
		}
	}
}

// checkProviders: every call the registered providers received during the
// scenario carried a key the runner handed out in it, and every idempotent
// call's key reached one of them; the calls with one key asked for one
// subject and got at most one effect. A call is another scenario's (wire
// scenarios run side by side) when its Scenario says so, or, without one,
// when its key was handed to another scenario's worker.
func (x *explorer[In]) checkProviders(sc *scenario) {
	if len(x.cfg.Providers) == 0 {
		return
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	handed := map[string]bool{}
	// idempotent: the keys of calls the provider is to deduplicate; a
	// not-idempotent call runs again after a reconcile verdict of not
	// done, with its key, and makes another effect.
	idempotent := map[string]bool{}
	for _, c := range sc.calls {
		handed[c.key] = true
		idempotent[c.key] = idempotent[c.key] || c.kind == idem.ForeignIdempotent
	}
	received := map[string]bool{}
	reported := map[string]bool{}
	for i, p := range x.cfg.Providers {
		subjects := map[string][]string{}
		effects := map[string][]string{}
		for _, c := range callsSince(p, sc.marks[i]) {
			if c.Scenario != "" && c.Scenario != sc.report.Key {
				continue // a scenario running beside this one made it
			}
			if owner, ok := sc.handed.Load(c.Key); c.Scenario == "" && ok && owner != sc.report.Key {
				continue // its key is another scenario's
			}
			received[c.Key] = true
			if c.Subject != "" && !slices.Contains(subjects[c.Key], c.Subject) {
				subjects[c.Key] = append(subjects[c.Key], c.Subject)
			}
			if c.Effect != "" && c.Err == nil && !slices.Contains(effects[c.Key], c.Effect) {
				effects[c.Key] = append(effects[c.Key], c.Effect)
			}
			if handed[c.Key] || reported[c.Key] {
				continue
			}
			reported[c.Key] = true
			key := fmt.Sprintf("key %q", c.Key)
			if c.Key == "" {
				key = "no idempotency key"
			}
			sc.violateLocked("provider %d received a call for %q with %s, which is no downstream key the runner handed out in this scenario: a foreign call made outside Attempt.Foreign, or one that does not send the key it is given", i, c.Subject, key)
		}
		for _, key := range slices.Sorted(maps.Keys(subjects)) {
			if s := subjects[key]; len(s) > 1 && idempotent[key] {
				sc.violateLocked("provider %d received the downstream key %q for %d different requests (%s): the call changed between runs of its phase, so a provider that deduplicates on the key answers the later ones with the first one's effect. A call that names a row an earlier phase of the same transaction created (Phase.JoinPrevious) names another row after a rollback; give the call a phase of its own after the row's commit", i, key, len(s), strings.Join(s, ", "))
			}
		}
		for _, key := range slices.Sorted(maps.Keys(effects)) {
			if e := effects[key]; len(e) > 1 && idempotent[key] {
				sc.violateLocked("provider %d made %d effects (%s) for one downstream key %q: it does not deduplicate, so the phase calling it must declare Foreign: idem.ForeignNotIdempotent, with a Reconcile hook", i, len(e), strings.Join(e, ", "), key)
			}
		}
	}
	for _, c := range sc.calls {
		if c.kind == idem.ForeignIdempotent && !received[c.key] {
			sc.violateLocked("the foreign call %q of phase %q was handed key %q, but no provider received it", c.name, c.phase, c.key)
			received[c.key] = true // once per key
		}
	}
}
