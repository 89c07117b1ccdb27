package idem

import (
	"context"
	"fmt"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// Backlog counts the unfinished keys of every scope and flow by status, and
// how old the oldest in each is: what a gauge of the needs_reconcile backlog
// and its age reads (idemotel's Observer.ObserveBacklog). It reads only
// unfinished rows, through a partial index, in one statement bounded by
// Config.StatementTimeout.
func (r *Runner) Backlog(ctx context.Context) (*idemtype.Backlog, error) {
	sctx, cancel := r.storeContext(ctx)
	defer cancel()
	b, err := r.store.Backlog(sctx, idemdriver.BacklogParams{Now: r.now()})
	if err != nil {
		err = r.storeError(ctx, err)
		r.emit(ctx, Event{Kind: EventStoreError, Err: err})
		return nil, fmt.Errorf("idem: backlog: %w", err)
	}
	return b, nil
}
