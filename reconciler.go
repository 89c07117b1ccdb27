package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Reconcile runs resolve keys stuck in needs-reconcile without waiting for a
// client: each idle needs-reconcile key of a registered flow is claimed (at
// most one instance claims it, as with the completer) and handed to
// [Runner.Reconcile], which asks the phase's reconcile hook what the provider
// did and, on a verdict, carries the flow on to its stored response. A hook
// that cannot tell yet leaves the key for the next run, IdleFor later.

// ReconcileConfig configures [Runner.ReconcileAll]. The zero value uses
// every default.
type ReconcileConfig struct {
	// IdleFor is how long a needs-reconcile key must have gone without a
	// run or a reconcile attempt before it is tried (again). It paces the
	// questions put to a provider that keeps answering "unknown".
	// Default 1m.
	IdleFor time.Duration

	// BatchSize is how many keys are claimed at a time. Default 10.
	BatchSize int

	// MaxKeys bounds one pass. Zero (the default) runs until no idle
	// needs-reconcile key is left.
	MaxKeys int
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *ReconcileConfig) WithDefaults() *ReconcileConfig {
	out := &ReconcileConfig{}
	if c != nil {
		*out = *c
	}
	if out.IdleFor == 0 {
		out.IdleFor = time.Minute
	}
	if out.BatchSize == 0 {
		out.BatchSize = 10
	}
	return out
}

func (c *ReconcileConfig) validate() error {
	return validateSweep("reconcile", c.IdleFor, c.BatchSize, c.MaxKeys)
}

// ReconcileResult is what one reconcile pass did.
type ReconcileResult struct {
	// Claimed counts the needs-reconcile keys this pass picked up.
	Claimed int `json:"claimed"`
	// Resolved counts keys whose hook gave a verdict and whose flow then
	// reached a stored response.
	Resolved int `json:"resolved"`
	// Unresolved counts keys left in needs-reconcile: the hook could not
	// tell, or failed.
	Unresolved int `json:"unresolved"`
	// Skipped counts keys someone else was reconciling or had resolved.
	Skipped int `json:"skipped"`
	// Failed counts keys whose hook gave a verdict but whose flow failed
	// afterwards; they are unfinished and unlocked, for a retry or the
	// completer.
	Failed int `json:"failed"`
}

// ReconcileAll runs one reconcile pass over the idle needs-reconcile keys of
// the flows registered in Config.Flows. Each hook verdict emits
// EventReconciled; keys left unresolved emit EventNeedsReconcile again. A
// key's own failure is counted and logged, not returned. A nil config means
// the defaults.
func (r *Runner) ReconcileAll(ctx context.Context, config *ReconcileConfig) (*ReconcileResult, error) {
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	flows := r.flowNames()
	if len(flows) == 0 {
		return nil, fmt.Errorf("%w: Config.Flows is empty, so this runner cannot reconcile any key", ErrUnknownFlow)
	}
	res := &ReconcileResult{}
	err := r.sweep(ctx, StatusNeedsReconcile, flows, cfg.IdleFor, 0, cfg.BatchSize, cfg.MaxKeys, func(rec *KeyRecord) {
		res.Claimed++
		out, err := r.Reconcile(ctx, rec.Scope, rec.Key)
		log := r.log.With("flow", rec.Flow, "scope", rec.Scope, "key", rec.Key)
		switch {
		case out.Kind == OutcomeExecuted:
			res.Resolved++
		case out.Kind == OutcomeNeedsReconcile:
			res.Unresolved++
			log.InfoContext(ctx, "idem: key still needs reconciliation", "err", err)
		case out.Kind == OutcomeInProgress || errors.Is(err, ErrNothingToReconcile) || errors.Is(err, ErrNotFound):
			res.Skipped++
		default:
			res.Failed++
			if ctx.Err() == nil {
				log.WarnContext(ctx, "idem: reconciled key failed to finish", "outcome", out.Kind, "err", err)
			}
		}
	})
	r.logPass(ctx, "reconcile", res.Claimed, err, "resolved", res.Resolved, "unresolved", res.Unresolved,
		"skipped", res.Skipped, "failed", res.Failed)
	return res, err
}
