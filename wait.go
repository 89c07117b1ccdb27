// Waiting for the attempt in flight of a key (Request.Wait): the store's
// one wait loop watches the key; the runner bounds how many wait, and the
// waiters of one attempt share what they find when it ends.

package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
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
		before := out.Record
		awaited := awaitedAttempt{scope: before.Scope, id: before.ID, fence: before.Fence}
		share := r.shares.join(awaited)
		woken, stop := r.store.WatchKey(waitCtx, idemdriver.Watch{
			Ref:    idemdriver.LockRef{ID: before.ID, Fence: before.Fence, Scope: before.Scope},
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
			r.shares.leave(awaited, share)
			break
		}
		out, err = r.executeAwoken(ctx, waitCtx, until, flow, req, stored, share)
		r.shares.leave(awaited, share)
		// Woken, but the same attempt holds the key with the same lease:
		// it ran out by the store's clock and not by the runner's (a test
		// clock).
		lapsed = out.Record != nil && out.Record.ID == before.ID && out.Record.Fence == before.Fence &&
			out.Record.LeaseExpiresAt != nil && before.LeaseExpiresAt != nil && out.Record.LeaseExpiresAt.Equal(*before.LeaseExpiresAt)
	}
	out.Waited = waited
	return out, err
}

// awaitedAttempt names the attempt a request waits for: its key (scope, id)
// and the fence it holds.
type awaitedAttempt struct {
	scope     string
	id, fence int64
}

// waitShare is what this process's waiters for one attempt share when it
// ends. Woken together (one notification or check wakes them all), they
// would each acquire the key at once: thousands of acquisitions queued
// for the pool's few connections, most of them past the store's timeout.
// Instead the first acquires it, and when it finds the key finished the
// others replay the record it read, each after checking that its own
// request is the key's (the fingerprint check of every acquisition). A
// share lives while any of its waiters waits, so a late waker finds the
// answer too.
type waitShare struct {
	waiters  int
	leading  bool                // a waiter acquires the key now
	done     chan struct{}       // closed when that acquisition returns
	finished *idemtype.KeyRecord // the finished key it found, to replay
}

// waitShares are the runner's shares, one per attempt waited for.
type waitShares struct {
	mu sync.Mutex
	m  map[awaitedAttempt]*waitShare
}

func (sh *waitShares) join(a awaitedAttempt) *waitShare {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil {
		sh.m = map[awaitedAttempt]*waitShare{}
	}
	s := sh.m[a]
	if s == nil {
		s = &waitShare{}
		sh.m[a] = s
	}
	s.waiters++
	return s
}

func (sh *waitShares) leave(a awaitedAttempt, s *waitShare) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.waiters--; s.waiters == 0 {
		delete(sh.m, a)
	}
}

// executeAwoken executes req once its wait woke: as the share's leader, or
// by replaying the finished key the leader found, or, when the leader found
// something else (the key free to take over, in progress again, gone), on
// its own, as every waiter did before.
func (r *Runner) executeAwoken(ctx, waitCtx context.Context, until time.Time, flow AnyFlow, req Request, stored *prepared, s *waitShare) (*Outcome, error) {
	sh := &r.shares
	sh.mu.Lock()
	if s.finished == nil && !s.leading {
		s.leading, s.done = true, make(chan struct{})
		sh.mu.Unlock()
		out, err := r.execute(ctx, flow, req, stored)
		sh.mu.Lock()
		s.leading = false
		if err == nil && out.replayed && out.Record != nil {
			s.finished = out.Record.Clone()
		}
		close(s.done)
		sh.mu.Unlock()
		return out, err
	}
	if s.leading {
		// The leader may be running the flow (it found the key free and
		// took it over): wait for it no longer than this request waits.
		done := s.done
		sh.mu.Unlock()
		timer := time.NewTimer(time.Until(until))
		select {
		case <-done:
		case <-timer.C:
		case <-waitCtx.Done():
		}
		timer.Stop()
		sh.mu.Lock()
	}
	finished := s.finished
	sh.mu.Unlock()
	if finished != nil {
		if out, ok := r.replayFinished(ctx, flow, req, stored, finished); ok {
			return out, nil
		}
	}
	return r.execute(ctx, flow, req, stored)
}

// replayFinished answers req with rec, a finished key another waiter read,
// when req is the key's own request (the check an acquisition makes);
// false sends req to the store.
func (r *Runner) replayFinished(ctx context.Context, flow AnyFlow, req Request, stored *prepared, rec *idemtype.KeyRecord) (*Outcome, bool) {
	if stored != nil || req.RetryOnly || rec.RecoveryPoint == idemtype.RecoveryPointAbandoned {
		return nil, false
	}
	if err := req.normalise(); err != nil {
		return nil, false
	}
	p, err := flow.prepare(&req, r.config.fingerprintKeys())
	if err != nil || !sameRequest(rec, flow, req, p) {
		return nil, false
	}
	r.emit(ctx, Event{Kind: EventReplayed, Flow: flow.Name(), Scope: req.Scope, Key: req.Key})
	return &Outcome{replayed: true, Response: rec.Response(), Record: rec.Clone()}, true
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
