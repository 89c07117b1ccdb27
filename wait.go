// Waiting for the attempt in flight of a key (Request.Wait): the store's
// one wait loop watches the key; the runner bounds how many wait.

package idem

import (
	"context"
	"errors"
	"time"

	"github.com/go-idem/idem/idemdriver"
)

// waitAndExecute waits, until req.Wait after started, for the attempt that
// holds the key out reports in progress to end, and executes req again
// each time it may have, and once more when the wait passes (a wake-up
// that never came). req.WaitContext (and ctx) ending stops the waiting at
// once. Outcome.Waited is the time spent waiting.
func (r *Runner) waitAndExecute(ctx context.Context, flow AnyFlow, req Request, stored *prepared, out *Outcome, err error, started time.Time) (*Outcome, error) {
	until := started.Add(req.Wait)
	waitCtx := ctx
	if req.WaitContext != nil {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(req.WaitContext, cancel)()
	}
	var waited time.Duration
	lapsed := false
	for errors.Is(err, ErrInProgress) && out.Record != nil {
		left := time.Until(until)
		if left <= 0 || waitCtx.Err() != nil {
			break
		}
		woken, stop := r.store.WatchKey(waitCtx, idemdriver.Watch{
			Ref:    idemdriver.LockRef{ID: out.Record.ID, Fence: out.Record.Fence, Scope: out.Record.Scope},
			Lapsed: lapsed,
		})
		began := time.Now()
		timer := time.NewTimer(left)
		wake := false
		select {
		case <-woken:
			wake = true
		case <-timer.C:
			// The wait's end: the key is acquired once more, as a retry
			// arriving now would acquire it.
			wake = true
		case <-waitCtx.Done():
		}
		timer.Stop()
		stop()
		waited += time.Since(began)
		if !wake {
			break
		}
		before := out.Record
		out, err = r.execute(ctx, flow, req, stored)
		// Woken, but the same attempt holds the key with the same lease:
		// it ran out by the store's clock and not by the runner's (a test
		// clock).
		lapsed = out.Record != nil && out.Record.ID == before.ID && out.Record.Fence == before.Fence &&
			out.Record.LeaseExpiresAt != nil && before.LeaseExpiresAt != nil && out.Record.LeaseExpiresAt.Equal(*before.LeaseExpiresAt)
	}
	out.Waited = waited
	return out, err
}

// enterWait counts req in among the runner's waiters, or reports false when
// Config.MaxWaiters of them wait already: req is then answered in progress
// at once.
func (r *Runner) enterWait(ctx context.Context, req Request) bool {
	n := r.waiting.Add(1)
	if max := int64(r.config.MaxWaiters); max > 0 && n > max {
		r.waiting.Add(-1)
		r.log.DebugContext(ctx, "idem: too many requests waiting; answered in progress at once", r.logAttrs(req.Scope, req.Key, 0, "max_waiters", max)...)
		return false
	}
	return true
}
