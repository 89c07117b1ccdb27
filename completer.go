package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idem/idem/idemtype"
)

// The completer finishes requests whose clients gave up. A client that
// timed out and never retried leaves its key unfinished: a ride created but
// not charged, a charge made but no receipt. The completer finds such keys
// (status running, nobody holding them, no run for IdleFor) and drives each
// to its response server-side, from the params stored with the key, through
// the same runner and flow as a client retry would: Runner.Execute takes the key
// over and resumes after its recovery point. The response is stored, so a
// client that comes back later gets the replay.
//
// Claims are disjoint across application instances (FOR UPDATE SKIP LOCKED,
// and a claimed key looks busy to the next claimer), and if a client retry
// races the completer for a key, the acquisition's fence lets exactly one of
// them run it. Keys that need reconciliation are left to reconcile runs:
// re-running a not-idempotent call is exactly what must not happen.

// CompleteConfig configures [Runner.Complete]. The zero value uses every
// default.
type CompleteConfig struct {
	// IdleFor is how long an unfinished key must have gone without running
	// (since its last_run_at) before the completer pushes it. Make it
	// comfortably longer than your clients' retry window, so the completer
	// picks up requests their clients gave up on rather than racing live
	// retries. Default CompleteIdleForDefault (5m).
	IdleFor time.Duration

	// BatchSize is how many keys are claimed at a time; they are run one
	// after another. Default CompleteBatchSizeDefault (10).
	BatchSize int

	// MaxAttempts leaves keys that have been attempted this many times
	// (by clients and the completer together) to an operator, so a request
	// that fails every time is not retried forever. They stay visible as
	// `idem keys list --state stale`. Default CompleteMaxAttemptsDefault (10);
	// negative means no limit.
	MaxAttempts int

	// MaxKeys bounds one pass. Zero (the default) runs until no idle key is
	// left.
	MaxKeys int
}

// Defaults of [CompleteConfig]'s fields.
const (
	CompleteIdleForDefault     = 5 * time.Minute
	CompleteBatchSizeDefault   = 10
	CompleteMaxAttemptsDefault = 10
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *CompleteConfig) WithDefaults() *CompleteConfig {
	out := &CompleteConfig{}
	if c != nil {
		*out = *c
	}
	out.IdleFor = cmp.Or(out.IdleFor, CompleteIdleForDefault)
	out.BatchSize = cmp.Or(out.BatchSize, CompleteBatchSizeDefault)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, CompleteMaxAttemptsDefault)
	return out
}

func (c *CompleteConfig) validate() error {
	return validateSweep("complete", c.IdleFor, c.BatchSize, c.MaxKeys)
}

// CompleteResult is what one completer pass did.
type CompleteResult struct {
	// Claimed counts the idle keys this pass picked up.
	Claimed int `json:"claimed"`
	// Completed counts the keys this pass drove to a stored response.
	Completed int `json:"completed"`
	// Skipped counts keys someone else got to first: a client retry
	// finished it or holds it now.
	Skipped int `json:"skipped"`
	// NeedsReconcile counts keys found to need reconciliation (a
	// not-idempotent call in doubt); reconcile runs take them from here.
	NeedsReconcile int `json:"needs_reconcile"`
	// Failed counts keys whose run failed; each is released for the next
	// pass or retry, and logged.
	Failed int `json:"failed"`
}

// completeOne reads a claimed key (claims carry no payload) and runs it from
// the input stored with it, under its own fingerprint.
func (r *Runner) completeOne(ctx context.Context, claimed *idemtype.KeyRecord) (*Outcome, error) {
	flow := r.flows[claimed.Flow]
	gctx, cancel := r.storeContext(ctx)
	rec, err := r.store.GetKey(gctx, claimed.Scope, claimed.Key)
	cancel()
	if err != nil {
		out := &Outcome{}
		err = fmt.Errorf("read key: %w", r.storeError(ctx, err))
		out.settle(err)
		return out, err
	}
	req := Request{Scope: rec.Scope, Key: rec.Key, Method: rec.Method, Path: rec.Path}
	return r.executeWith(ctx, flow, req, storedInput(rec))
}

// Complete runs one completer pass: it claims idle unfinished keys of the
// flows registered in Config.Flows, batch by batch, and runs each to its
// response. Each key it completes emits EventCompleted (Duration: the run).
// A key's own failure is counted and logged, not returned; the error is for
// what stops the pass (the store, ctx). A nil config means the defaults.
func (r *Runner) Complete(ctx context.Context, config *CompleteConfig) (*CompleteResult, error) {
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(r.flows) == 0 {
		return nil, fmt.Errorf("%w: Config.Flows is empty, so this runner cannot complete any key", ErrUnknownFlow)
	}
	r.warnOtherFlows(ctx)
	var flows []string
	for _, name := range r.flowNames() {
		if r.flows[name].Redrives() {
			flows = append(flows, name)
		}
	}
	res := &CompleteResult{}
	if len(flows) == 0 {
		// Every flow waits for its clients (FlowConfig.NoRedrive).
		return res, nil
	}
	err := r.sweep(ctx, idemtype.StoredRunning, flows, cfg.IdleFor, cfg.MaxAttempts, cfg.BatchSize, cfg.MaxKeys, func(claimed *idemtype.KeyRecord) {
		res.Claimed++
		started := time.Now()
		log := r.log.With(r.logAttrs(claimed.Scope, claimed.Key, claimed.ID, "flow", claimed.Flow)...)
		out, err := r.completeOne(ctx, claimed)
		rec := claimed
		switch out.Kind {
		case OutcomeExecuted:
			res.Completed++
			r.emit(ctx, Event{Kind: EventCompleted, Flow: rec.Flow, Scope: rec.Scope, Key: rec.Key, Duration: time.Since(started)})
			log.InfoContext(ctx, "idem: completed a request its client left unfinished", "status", out.Response.Status, "resumed_after", rec.RecoveryPoint)
		case OutcomeReplayed, OutcomeInProgress:
			res.Skipped++
			log.DebugContext(ctx, "idem: completer found the key taken care of", "outcome", out.Kind)
		case OutcomeInvalid:
			if !errors.Is(err, ErrNotFound) {
				res.Failed++
				log.WarnContext(ctx, "idem: completer could not finish a key", "outcome", out.Kind, "err", r.logErr(err, rec.Scope, rec.Key))
				return
			}
			res.Skipped++
			log.DebugContext(ctx, "idem: completer found the key taken care of", "outcome", out.Kind)
		case OutcomeNeedsReconcile:
			res.NeedsReconcile++
			log.WarnContext(ctx, "idem: completer left a key to reconciliation", "err", r.logErr(err, rec.Scope, rec.Key))
		default:
			res.Failed++
			if ctx.Err() == nil {
				log.WarnContext(ctx, "idem: completer could not finish a key", "outcome", out.Kind, "err", r.logErr(err, rec.Scope, rec.Key))
			}
		}
	})
	r.logPass(ctx, "complete", res.Claimed, err, "completed", res.Completed, "skipped", res.Skipped,
		"needs_reconcile", res.NeedsReconcile, "failed", res.Failed)
	return res, err
}
