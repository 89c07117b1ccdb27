package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idem/idem/idemdriver"
)

// The reaper keeps the keys table small. A finished key is replayed until its
// expires_at (finished_at + retention); after that it is dead weight (a
// request with the key replaces it rather than replaying it), and the
// reaper deletes it in small batches: each batch is one short DELETE of at
// most BatchSize rows, found through the partial index on expires_at, in a
// transaction of its own with a statement timeout. Rows are locked one by one
// (FOR UPDATE SKIP LOCKED), never the table, so acquisitions, phases and other
// reapers carry on around it: two application instances reaping at once
// delete disjoint batches.
//
// Then it deletes old unfinished keys: a key in status running created
// longer ago than its flow's UnfinishedRetention (Config.UnfinishedRetention, 7 days by
// default, or FlowConfig.UnfinishedRetention) is deleted the same way, in batches,
// unless a live lease holds it. Its request keeps failing, or its client gave
// up and nothing finished it: without this such keys would stay forever. A
// request with a deleted key afterwards runs as a new request, from the
// first phase. A key in needs_reconcile is never deleted this way, nor is a
// key whose not-idempotent call is in doubt (its foreign mark stands: the
// process died after the call, before the phase committed): deleting it
// would let the next request repeat the call. The reaper moves such a key to
// needs_reconcile instead, for a reconcile run to ask the provider.
//
// Business rows that reference a key survive its deletion; their foreign
// keys should be ON DELETE SET NULL (and indexed, or each deleted key costs a
// scan of the referencing table).

// ReapConfig configures [Runner.Reap]. The zero value uses every default.
type ReapConfig struct {
	// BatchSize is the most keys one DELETE removes. Small batches keep
	// each statement short and its WAL burst small. Default 1000.
	BatchSize int

	// MaxBatches bounds one pass. Zero (the default) reaps until no expired
	// key is left.
	MaxBatches int

	// StatementTimeout bounds each batch's statement, so a batch stuck
	// behind a lock on a referencing business row gives up instead of
	// queueing others behind it. Default 10s.
	StatementTimeout time.Duration

	// Pause is a wait between batches, to leave the database room for the
	// application's own load while a large backlog drains. Default 0.
	Pause time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *ReapConfig) WithDefaults() *ReapConfig {
	out := &ReapConfig{}
	if c != nil {
		*out = *c
	}
	if out.BatchSize == 0 {
		out.BatchSize = 1000
	}
	if out.StatementTimeout == 0 {
		out.StatementTimeout = 10 * time.Second
	}
	return out
}

func (c *ReapConfig) validate() error {
	var errs []error
	if c.BatchSize < 1 || c.BatchSize > 100_000 {
		errs = append(errs, fmt.Errorf("BatchSize %d is outside 1-100000", c.BatchSize))
	}
	if c.MaxBatches < 0 {
		errs = append(errs, fmt.Errorf("MaxBatches %d is negative", c.MaxBatches))
	}
	if c.StatementTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("StatementTimeout %s is under 1ms", c.StatementTimeout))
	}
	if c.Pause < 0 {
		errs = append(errs, fmt.Errorf("Pause %s is negative", c.Pause))
	}
	if len(errs) > 0 {
		return fmt.Errorf("idem: invalid reap config: %w", errors.Join(errs...))
	}
	return nil
}

// ReapResult is what one reaper pass did.
type ReapResult struct {
	// Deleted counts the expired finished keys deleted.
	Deleted int `json:"deleted"`
	// Batches counts the DELETE statements of expired keys run, the last
	// (short) one included.
	Batches int `json:"batches"`
	// Unfinished counts the unfinished keys deleted past their
	// UnfinishedRetention (in batches of their own, bounded by the same
	// BatchSize and MaxBatches).
	Unfinished int `json:"unfinished"`
	// NeedsReconcile counts the unfinished keys moved to needs_reconcile
	// instead of deleted: their not-idempotent call is in doubt.
	NeedsReconcile int `json:"needs_reconcile"`
}

// Reap deletes finished keys whose expiry has passed, batch by batch, until
// none is left, MaxBatches is reached or ctx ends; then, the same way,
// unfinished keys past their UnfinishedRetention. Each batch with
// deletions emits EventReaped (EventReapedUnfinished) with its Count; a failing
// batch emits EventStoreError and ends the pass with the error (what was
// deleted before stays deleted, and the next pass carries on). A nil config
// means the defaults.
func (r *Runner) Reap(ctx context.Context, config *ReapConfig) (*ReapResult, error) {
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	res, err := r.reapExpired(ctx, cfg)
	if err != nil {
		return res, err
	}
	return res, r.reapAbandoned(ctx, cfg, res)
}

func (r *Runner) reapExpired(ctx context.Context, cfg *ReapConfig) (*ReapResult, error) {
	res := &ReapResult{}
	started := time.Now()
	err := r.inBatches(ctx, cfg, EventReaped, "idem: reaper batch failed", &res.Deleted, &res.Batches,
		func(ctx context.Context) (int, int, error) {
			n, err := r.store.Reap(ctx, idemdriver.ReapParams{Limit: cfg.BatchSize, StatementTimeout: cfg.StatementTimeout, Now: r.now()})
			return n, n, err
		})
	switch {
	case err != nil && ctx.Err() == nil:
		return res, fmt.Errorf("reap: %w", err)
	case err != nil:
		return res, err
	}
	if res.Deleted > 0 {
		r.log.InfoContext(ctx, "idem: reaped expired keys", "deleted", res.Deleted, "batches", res.Batches, "took", time.Since(started).String())
	} else {
		r.log.DebugContext(ctx, "idem: reaper found no expired keys")
	}
	return res, nil
}

// inBatches runs batch until it handles fewer than cfg.BatchSize keys,
// cfg.MaxBatches is reached or ctx ends, pausing cfg.Pause between batches.
// A batch returns the keys it deleted and those it handled (deleted or
// otherwise ended). It adds each batch's deletions to *deleted and counts
// batches in *batches,
// emits kind for a batch that deleted keys, and for a failing batch emits
// EventStoreError, logs failed (with what was deleted so far) and returns
// the error; when ctx ends it returns ctx's cause.
func (r *Runner) inBatches(ctx context.Context, cfg *ReapConfig, kind EventKind, failed string, deleted, batches *int, batch func(context.Context) (deleted, handled int, err error)) error {
	for ran := 0; cfg.MaxBatches == 0 || ran < cfg.MaxBatches; ran++ {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		n, handled, err := batch(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			r.emit(ctx, Event{Kind: EventStoreError, Err: err})
			r.log.ErrorContext(ctx, failed, "deleted_so_far", *deleted, "err", r.redact(err))
			return err
		}
		*batches++
		*deleted += n
		if n > 0 {
			r.emit(ctx, Event{Kind: kind, Count: n})
		}
		if handled < cfg.BatchSize {
			// Nothing more is left, or what is left is locked by another
			// reaper, which will take it.
			break
		}
		if cfg.Pause > 0 {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(cfg.Pause):
			}
		}
	}
	return nil
}

// reapAbandoned deletes abandoned unfinished keys batch by batch, adding
// them to res.
func (r *Runner) reapAbandoned(ctx context.Context, cfg *ReapConfig, res *ReapResult) error {
	p := idemdriver.ReapUnfinishedParams{After: r.config.UnfinishedRetention, FlowAfter: map[string]time.Duration{},
		Limit: cfg.BatchSize, StatementTimeout: cfg.StatementTimeout, Now: r.now()}
	for name, f := range r.flows {
		if after := f.abandonAfterOr(r.config.UnfinishedRetention); after != r.config.UnfinishedRetention {
			p.FlowAfter[name] = after
		}
	}
	var batches, parked int
	err := r.inBatches(ctx, cfg, EventReapedUnfinished, "idem: reaper batch of unfinished keys failed", &res.Unfinished, &batches,
		func(ctx context.Context) (int, int, error) {
			res, err := r.store.ReapUnfinished(ctx, p)
			if res.NeedsReconcile > 0 {
				parked += res.NeedsReconcile
				r.emit(ctx, Event{Kind: EventNeedsReconcile, Count: res.NeedsReconcile})
			}
			return res.Deleted, res.Deleted + res.NeedsReconcile, err
		})
	res.NeedsReconcile += parked
	switch {
	case err != nil && ctx.Err() == nil:
		return fmt.Errorf("reap unfinished keys: %w", err)
	case err != nil:
		return err
	}
	if parked > 0 {
		r.log.WarnContext(ctx, "idem: unfinished keys abandoned with a not-idempotent call in doubt moved to needs_reconcile, not deleted; a reconcile run decides",
			"needs_reconcile", parked)
	}
	if res.Unfinished > 0 {
		r.log.WarnContext(ctx, "idem: deleted unfinished keys past their UnfinishedRetention; a request with one of them runs anew",
			"unfinished", res.Unfinished)
	}
	return nil
}
