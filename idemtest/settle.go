package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// settle retries the scenario's key, as clients, the completer and
// operators would, until it reaches a final response: a crashed worker's
// lease is made to expire, a failed attempt is retried, a key in
// needs_reconcile is reconciled. A nil out starts with a run.
func (x *explorer[In]) settle(ctx context.Context, sc *scenario, out *idem.Outcome, err error) *idemtype.Response {
	if out == nil {
		out, err = x.call(ctx, sc, nil, opRun, x.store)
	}
	for retries := 0; ; retries++ {
		if out.Kind == idem.OutcomeExecuted || out.Kind == idem.OutcomeReplayed {
			if out.Response == nil {
				sc.violate("outcome %s came without a response", out.Kind)
			}
			return out.Response
		}
		switch {
		case out.Kind == idem.OutcomeInvalid || out.Kind == idem.OutcomeMismatch:
			sc.violate("a retry of the same request got %s", outcomeText(out, err))
			return nil
		case retries == x.cfg.MaxAttempts:
			sc.violate("no final outcome after %d retries; the last: %s", retries, outcomeText(out, err))
			return nil
		case ctx.Err() != nil:
			sc.violate("gave up retrying: %v", context.Cause(ctx))
			return nil
		}
		switch {
		case errors.Is(err, ErrSimulatedCrash):
			sc.advance(x.lease+time.Second, "the dead worker's lease runs out")
		case out.Kind == idem.OutcomeInProgress:
			sc.advance(x.lease+time.Second, "the lease holding the key runs out")
		}
		op := opRun
		if out.Kind == idem.OutcomeNeedsReconcile || (out.Record != nil && out.Record.Status == idemtype.StoredNeedsReconcile) {
			op = opReconcile
		}
		out, err = x.call(ctx, sc, nil, op, x.store)
	}
}

// completerIdleFor is the completer's IdleFor in the wire scenarios: the
// default, which the scenario's clock jumps past.
const completerIdleFor = 5 * time.Minute

// settleWire drives the key to its response after the faulted request:
// the client retries at once; if that does not finish it, the client gives
// up, the key idles, and a completer pass takes it; settle does the rest.
func (x *explorer[In]) settleWire(ctx context.Context, sc *scenario, out *idem.Outcome, err error) *idemtype.Response {
	if done(out) {
		return x.settle(ctx, sc, out, err)
	}
	out, err = x.call(ctx, sc, nil, opRun, x.store)
	if done(out) || out.Kind == idem.OutcomeNeedsReconcile || out.Kind == idem.OutcomeInvalid || out.Kind == idem.OutcomeMismatch {
		return x.settle(ctx, sc, out, err)
	}
	sc.advance(x.lease+completerIdleFor+time.Second, "the client gives up; the key idles past the lease and the completer's IdleFor")
	x.complete(ctx, sc)
	return x.settle(ctx, sc, nil, nil)
}

func done(out *idem.Outcome) bool {
	return out.Kind == idem.OutcomeExecuted || out.Kind == idem.OutcomeReplayed
}

// complete runs a completer pass (Runner.Complete) whose claim only ever
// returns the scenario's key.
func (x *explorer[In]) complete(ctx context.Context, sc *scenario) {
	w := sc.newWorker(nil)
	r, err := idem.NewRunner(oneKeyClaims{Store: x.store, scope: sc.scope, key: sc.report.Key}, x.runnerConfig(w, sc.clock.Now))
	if err != nil {
		sc.violate("could not make a runner: %v", err)
		return
	}
	res, err := r.Complete(withScenario(ctx, sc.report.Key), &idem.CompleteConfig{IdleFor: completerIdleFor})
	ended := "error"
	if res != nil {
		ended = fmt.Sprintf("claimed %d, completed %d, needs_reconcile %d, failed %d", res.Claimed, res.Completed, res.NeedsReconcile, res.Failed)
	}
	if err != nil {
		ended += ": " + err.Error()
	}
	sc.workerStep(w.n, w.describe(opComplete, ended))
}

// oneKeyClaims is the store of a wire scenario's completer: its claim
// returns the scenario's key when the store's would claim it (idle in the
// status asked for, of a flow asked for, unlocked or its lease expired, not
// attempted too often), and never another key, so that scenarios running
// side by side, and explorations sharing the database, never take one
// another's keys. Unlike the store's claim it does not mark the key as
// run: the completer's acquisition does.
type oneKeyClaims struct {
	idemdriver.Store
	scope, key string
}

func (s oneKeyClaims) ClaimIdle(ctx context.Context, p idemdriver.ClaimIdleParams) ([]*idemtype.KeyRecord, error) {
	rec, err := s.GetKey(ctx, s.scope, s.key)
	if errors.Is(err, idemtype.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if p.Now != nil {
		now = *p.Now
	}
	idle := rec.Status == p.Status && slices.Contains(p.Flows, rec.Flow) &&
		(rec.LockedAt == nil || (rec.LeaseExpiresAt != nil && !rec.LeaseExpiresAt.After(now))) &&
		!rec.LastRunAt.After(now.Add(-p.IdleFor)) &&
		(p.MaxAttempts <= 0 || rec.Attempts < p.MaxAttempts)
	if !idle || p.Limit < 1 {
		return nil, nil
	}
	return []*idemtype.KeyRecord{rec}, nil
}
