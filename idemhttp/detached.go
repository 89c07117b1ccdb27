package idemhttp

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// DetachedLimitDefault is the limit of [DefaultDetachedRuns].
const DetachedLimitDefault = 1000

// DefaultDetachedRuns is the bound that every Handler whose
// Config.Detached is nil shares: one per process, as the goroutines,
// memory and connections such runs hold are the process's.
var DefaultDetachedRuns = NewDetachedRuns(DetachedLimitDefault)

// DetachedRuns bounds, for a process, the flows that run on without a
// client waiting for them: those answered 202 Accepted (Config.RespondAsync)
// and those whose client went away while they ran, which the handlers run
// to completion rather than leave half done. Both kinds count against one
// limit. Beyond it, a request that prefers respond-async is answered as if
// it had not asked (it runs while its client waits, and the answer says so
// in the Idem-Async header), and a run whose client leaves is stopped: its
// phase rolls back and its key is released, as a process that died would
// leave it, for the client's retry or for the completer
// (idem.Maintainer) to finish (a not-idempotent foreign call it stopped
// is left in doubt, for a reconcile run, as after a crash).
//
// Running is the gauge to export (idemotel's Observer.ObserveDetached
// registers it).
// A DetachedRuns is safe for concurrent use; share one between every
// Handler of a process, through Config.Detached, or let them share
// DefaultDetachedRuns.
//
// The runs answered 202 belong to no handler, so http.Server.Shutdown does
// not wait for them: call Wait after it, or a deploy stops them half done
// and leaves them to the completer.
type DetachedRuns struct {
	limit   int64
	running atomic.Int64
	mu      sync.Mutex    // serialises enter and leave with Wait
	idle    chan struct{} // closed when running drops to 0; nil while no one waits
}

// NewDetachedRuns returns a bound of limit runs at once; limit must be
// positive.
func NewDetachedRuns(limit int) *DetachedRuns {
	if limit <= 0 {
		panic(fmt.Sprintf("idemhttp: NewDetachedRuns: limit %d is not positive", limit))
	}
	return &DetachedRuns{limit: int64(limit)}
}

// Running is how many flows run detached now: answered 202 and not over
// yet, or left by their clients and not over yet.
func (d *DetachedRuns) Running() int { return int(d.running.Load()) }

// Limit is the most flows that run detached at once.
func (d *DetachedRuns) Limit() int { return int(d.limit) }

// enter counts one more detached run, or reports false when Limit of them
// run already.
func (d *DetachedRuns) enter() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running.Load() >= d.limit {
		return false
	}
	d.running.Add(1)
	return true
}

// leave ends a run that enter counted.
func (d *DetachedRuns) leave() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running.Add(-1) == 0 && d.idle != nil {
		close(d.idle)
		d.idle = nil
	}
}

// Wait waits until no flow runs detached, or ctx ends. Call it once
// http.Server.Shutdown has returned: no new run starts then, and the
// requests answered 202, which Shutdown does not wait for, finish instead
// of being cut off with the process (the completer would finish them, but
// only once their lease has run out).
func (d *DetachedRuns) Wait(ctx context.Context) error {
	d.mu.Lock()
	if d.running.Load() == 0 {
		d.mu.Unlock()
		return nil
	}
	if d.idle == nil {
		d.idle = make(chan struct{})
	}
	idle := d.idle
	d.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("idemhttp: %d detached runs still running: %w", d.Running(), ctx.Err())
	}
}
