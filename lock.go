package idem

import (
	"context"
	"errors"
	"time"
)

// The lock on a key is a lease with a fencing token.
//
// Acquiring sets locked_at, a lease expiry Config.Lease ahead, and a fence
// one higher than any before it. While the request runs, a heartbeat renews
// the expiry every Config.HeartbeatInterval, so a slow but live worker keeps
// its key; a dead worker stops renewing and, once the lease has expired, the
// next retry takes the key over with a new fence.
//
// Expiry alone cannot stop a worker that is merely paused (a long GC, a
// frozen VM) from waking up and committing after it was taken over. The
// fence does: every phase commit, release, heartbeat and foreign mark is an
// UPDATE guarded by "fence = the fence I acquired with". A worker whose
// fence moved on matches no row, rolls its phase back and stops with
// ErrLockLost, so at any moment at most one worker can commit a phase of a
// key.
//
// The heartbeat and the foreign mark write the key's lease (in the store's
// own row for it, see pgstore), never what a phase commit writes: a phase at
// repeatable read or serializable whose commit updated a row version newer
// than its snapshot would fail with a serialization failure, every time, for
// as long as heartbeats land while it runs. A phase commit therefore does not
// renew the lease either; heartbeats alone do.

// holdLease starts the heartbeat for a held key. The returned context is
// cancelled with cause ErrLockLost as soon as a heartbeat finds the lease
// gone, which aborts the running phase's statements early; the fenced commit
// would refuse it anyway. release stops the heartbeat.
//
// The heartbeat runs until release, whatever the request is doing, on a
// context of its own: the caller's context ending does not stop it (a phase
// may carry on past it, a commit in flight is finished), only release or a
// lost lease does. While the
// worker is letting go of the key (a final commit in flight, a release) a
// refused beat is expected and ignored, and if the final commit then fails and
// the phase is retried, the beats that follow keep the lease alive again.
func (r *Runner) holdLease(ctx context.Context, h *held) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	// The beats' own context: the caller's values (trace, logger), not its
	// cancellation; release ends it.
	bctxBase, stopBeats := context.WithCancel(context.WithoutCancel(ctx))
	stop := make(chan struct{})
	done := make(chan struct{})
	ref, key := h.ref, h.rec.Key
	logAttrs := h.logAttrs()
	ev := Event{Flow: h.flow.Name(), Scope: h.rec.Scope, Key: key}
	go func() {
		defer close(done)
		ticker := time.NewTicker(r.config.HeartbeatInterval)
		defer ticker.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ticker.C:
			}
			if bctxBase.Err() != nil {
				return
			}
			if h.lettingGo.Load() {
				continue
			}
			bctx, bcancel := r.storeContext(bctxBase)
			sent := r.localNow()
			_, err := r.store.Heartbeat(bctx, ref, r.config.Lease, r.now())
			bcancel()
			switch {
			case h.lettingGo.Load():
				// The request finished or let go of the key while the beat
				// was in flight; a refused beat means nothing now.
			case err == nil:
				h.renewed(sent)
				ev.Kind, ev.Err = EventHeartbeat, nil
				r.emit(bctxBase, ev)
			case errors.Is(err, ErrLockLost):
				ev.Kind, ev.Err = EventLockLost, err
				r.emit(bctxBase, ev)
				cancel(ErrLockLost)
				return
			default:
				// A transient store error: keep trying. If the store stays
				// away past the lease, another worker may take over; this
				// one stops before its next foreign call (self-fencing) and
				// the fence stops it at its next commit.
				ev.Kind, ev.Err = EventStoreError, err
				r.emit(bctxBase, ev)
				r.log.WarnContext(bctxBase, "idem: heartbeat failed", append(logAttrs, "err", r.redact(err))...)
			}
		}
	}()
	return ctx, func() {
		// Cancel first: a beat in flight ends now rather than holding up
		// the request's answer.
		close(stop)
		stopBeats()
		cancel(nil)
		<-done
	}
}
