package idem

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// The completer and reconcile runs are both sweeps: they claim idle keys in
// one status, batch by batch, and hand each to the runner. What they share
// lives here.

// validateSweep checks the settings the completer and reconcile runs share.
func validateSweep(what string, idleFor time.Duration, batchSize, maxKeys int) error {
	var errs []error
	if idleFor <= 0 {
		errs = append(errs, fmt.Errorf("IdleFor %s must be positive", idleFor))
	}
	if batchSize < 1 || batchSize > 1000 {
		errs = append(errs, fmt.Errorf("BatchSize %d is outside 1-1000", batchSize))
	}
	if maxKeys < 0 {
		errs = append(errs, fmt.Errorf("MaxKeys %d is negative", maxKeys))
	}
	if len(errs) > 0 {
		return fmt.Errorf("idem: invalid %s config: %w", what, errors.Join(errs...))
	}
	return nil
}

// sweep claims idle keys in status batch by batch and hands each to handle,
// until a batch comes back short, maxKeys keys were handled, or ctx ends.
// Keys already handled in this pass are not handled again, whatever a
// frozen test clock makes them look like.
func (r *Runner) sweep(ctx context.Context, status idemtype.StoredStatus, flows []string, idleFor time.Duration, maxAttempts, batchSize, maxKeys int, handle func(*idemtype.KeyRecord)) error {
	seen := map[int64]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		limit := batchSize
		if maxKeys > 0 {
			limit = min(limit, maxKeys-len(seen))
			if limit <= 0 {
				return nil
			}
		}
		cctx, cancel := r.storeContext(ctx)
		recs, err := r.store.ClaimIdle(cctx, idemdriver.ClaimIdleParams{
			Status: status, Flows: flows, IdleFor: idleFor, MaxAttempts: maxAttempts, Limit: limit, Now: r.now(),
		})
		cancel()
		if err != nil && ctx.Err() != nil {
			return context.Cause(ctx)
		}
		fresh := 0
		for _, rec := range recs {
			if seen[rec.ID] {
				continue
			}
			seen[rec.ID] = true
			fresh++
			if ctx.Err() != nil {
				// Claimed but not run: the key waits IdleFor again, then
				// the next pass (here or elsewhere) takes it.
				return context.Cause(ctx)
			}
			handle(rec)
		}
		if err != nil {
			// The keys claimed before the error were run above.
			r.emit(ctx, Event{Kind: EventStoreError, Err: err})
			return err // the store's error names the claim
		}
		if len(recs) < limit || fresh == 0 {
			return nil
		}
	}
}

// logPass logs the end of a completer or reconcile pass: at info when it
// touched keys, at debug when idle, at error when the pass broke off.
func (r *Runner) logPass(ctx context.Context, what string, claimed int, err error, attrs ...any) {
	attrs = append([]any{"claimed", claimed}, attrs...)
	switch {
	case err != nil && ctx.Err() == nil:
		r.log.ErrorContext(ctx, "idem: "+what+" pass failed", append(attrs, "err", r.redact(err))...)
	case claimed > 0:
		r.log.InfoContext(ctx, "idem: "+what+" pass done", attrs...)
	default:
		r.log.DebugContext(ctx, "idem: "+what+" pass found nothing to do")
	}
}

// flowNames returns the registered flows' names, sorted.
func (r *Runner) flowNames() []string {
	names := make([]string, 0, len(r.flows))
	for name := range r.flows {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
