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
// fence does: every phase commit, release and heartbeat is an UPDATE guarded
// by "fence = the fence I acquired with". A worker whose fence moved on
// matches no row, rolls its phase back and stops with ErrLockLost, so at any
// moment at most one worker can commit a phase of a key.

// holdLease starts the heartbeat for a held request. The returned context is
// cancelled with cause ErrLockLost as soon as a heartbeat finds the lease
// gone, which aborts the running phase's statements early; the fenced commit
// would refuse it anyway. release stops the heartbeat.
func (r *Runner) holdLease(ctx context.Context, st *runState) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	done := make(chan struct{})
	ref, key, ended := st.ref, st.rec.Key, &st.leaseEnded
	ev := Event{Flow: st.flow.Name(), Scope: st.rec.Scope, Key: key}
	go func() {
		defer close(done)
		ticker := time.NewTicker(r.config.HeartbeatInterval)
		defer ticker.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			if ended.Load() {
				return
			}
			_, err := r.store.Heartbeat(ctx, ref, r.config.Lease, r.now())
			switch {
			case ended.Load():
				// The request finished or let go of the key while the beat
				// was in flight; a refused beat means nothing now.
				return
			case err == nil:
				ev.Kind, ev.Err = EventHeartbeat, nil
				r.emit(ctx, ev)
			case errors.Is(err, ErrLockLost):
				ev.Kind, ev.Err = EventLockLost, err
				r.emit(ctx, ev)
				cancel(ErrLockLost)
				return
			case ctx.Err() != nil:
				return
			default:
				// A transient store error: keep trying. If the store stays
				// away past the lease, another worker may take over, and the
				// fence will stop this one at its next commit.
				ev.Kind, ev.Err = EventStoreError, err
				r.emit(ctx, ev)
				r.log.WarnContext(ctx, "idem: heartbeat failed", "key", key, "err", err)
			}
		}
	}()
	return ctx, func() {
		close(stop)
		<-done
		cancel(nil)
	}
}
