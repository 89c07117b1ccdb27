package idemtest

import (
	"context"
	"time"

	"github.com/go-idem/idem"
)

// settle retries the scenario's key, as clients, the completer and
// operators would, until it reaches a final response: a crashed worker's
// lease is made to expire, a failed attempt is retried, a key in
// needs_reconcile is reconciled. A nil out starts with a run.
func (x *explorer[In]) settle(ctx context.Context, sc *scenario, out *idem.Outcome, err error) *idem.Response {
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
		switch out.Kind {
		case idem.OutcomeAbandoned:
			sc.advance(x.lease+time.Second, "the dead worker's lease runs out")
		case idem.OutcomeInProgress:
			sc.advance(x.lease+time.Second, "the lease holding the key runs out")
		}
		op := opRun
		if out.Kind == idem.OutcomeNeedsReconcile || (out.Record != nil && out.Record.Status == idem.StatusNeedsReconcile) {
			op = opReconcile
		}
		out, err = x.call(ctx, sc, nil, op, x.store)
	}
}
