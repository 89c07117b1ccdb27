package idem

import (
	"context"
	"errors"
	"sync"
)

// ErrRunnerStarted is returned by [Runner.Start] when the runner's services
// already run.
var ErrRunnerStarted = errors.New("idem: runner already started")

// services is what Runner.Start started.
type services struct {
	mu     sync.Mutex
	stop   context.CancelFunc
	done   chan struct{}
	served error
}

// Start runs what a service needs beside its requests, in the background:
// the maintenance services of Config.Maintenance (the reaper, the completer,
// which finishes requests whose clients gave up, and reconcile runs; see
// [Maintainer]), until [Runner.Stop] or until ctx ends. Call it once per
// process, after NewRunner, and Stop before the store closes:
//
//	runner, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{createOrder}})
//	...
//	if err := runner.Start(ctx); err != nil { ... }
//	defer runner.Stop(context.Background())
//
// Requests do not need Start: Execute and the adapters work without it.
// Start returns an error for a maintenance config that does not validate
// (a runner without Config.Flows cannot complete or reconcile: disable
// those services with a negative interval), and ErrRunnerStarted when the
// services already run.
func (r *Runner) Start(ctx context.Context) error {
	r.services.mu.Lock()
	defer r.services.mu.Unlock()
	if r.services.done != nil {
		return ErrRunnerStarted
	}
	m, err := NewMaintainer(r, r.config.Maintenance)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	r.services.stop, r.services.done, r.services.served = stop, done, nil
	go func() {
		defer close(done)
		err := m.Serve(runCtx)
		r.services.mu.Lock()
		r.services.served = err
		r.services.mu.Unlock()
	}()
	return nil
}

// Stop stops the services Start started and waits for them to end, or for
// ctx to end first (its error is then returned, and they stop on their
// own). A pass in flight is interrupted as a client disconnect interrupts a
// request: its phase rolls back and the key is released for the next pass
// of any instance. Stop without Start does nothing; after Stop, Start may
// run the services again.
func (r *Runner) Stop(ctx context.Context) error {
	r.services.mu.Lock()
	stop, done := r.services.stop, r.services.done
	r.services.mu.Unlock()
	if done == nil {
		return nil
	}
	stop()
	if ctx.Err() != nil {
		// Ended already: do not race it against the services' end.
		return context.Cause(ctx)
	}
	select {
	case <-done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	r.services.mu.Lock()
	defer r.services.mu.Unlock()
	err := r.services.served
	if r.services.done == done {
		r.services.stop, r.services.done, r.services.served = nil, nil, nil
	}
	return err
}
