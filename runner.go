package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-idem/idem/idemdriver"
)

// Runner runs flows: acquire the key, decide, resume at the phase after the
// recovery point, and run each phase in its own fenced transaction until one
// responds. A Runner is safe for concurrent use; make one per process.
//
// A request's path through the files of this package, forward: a
// [Request] (request.go) is fingerprinted and decoded by its flow
// (input.go); [Runner.Execute] (runner.go) acquires its key and decides
// (decide.go), or waits for the attempt in flight (wait.go); a held key is
// driven phase by phase (drive.go), each phase-like body running in its
// transaction through runBody (body.go) with its lease kept alive and fenced
// (held.go, lock.go); the phase reaches the store only through its [Tx] and
// the [Attempt] handle (attempt.go); an attempt that fails leaves its key
// for a retry or for reconciliation (failure.go).
type Runner struct {
	store  idemdriver.Store
	config *Config
	flows  map[string]AnyFlow
	log    *slog.Logger
	// waiting counts the requests waiting for a key in flight now
	// (Config.MaxWaiters).
	waiting atomic.Int64
	// shares are what the waiters of one attempt share when it ends.
	shares waitShares
	// services are what Start started (start.go).
	services services
}

// NewRunner returns a runner on store. A nil config means all defaults.
func NewRunner(store idemdriver.Store, config *Config) (*Runner, error) {
	if store == nil {
		return nil, errors.New("idem: NewRunner needs a store")
	}
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Runner{store: store, config: cfg, flows: map[string]AnyFlow{}, log: cfg.Logger}
	for _, f := range cfg.Flows {
		r.flows[f.Name()] = f
	}
	r.warnUnkeyedFingerprints()
	return r, nil
}

// Config returns the runner's configuration with defaults applied. Treat it
// as read-only.
func (r *Runner) Config() *Config { return r.config }

// Flow returns the registered flow with the given name.
func (r *Runner) Flow(name string) (AnyFlow, bool) {
	f, ok := r.flows[name]
	return f, ok
}

// Execute runs flow for req and returns the outcome. The error is nil exactly
// for OutcomeExecuted and OutcomeReplayed (a stored decline is still an
// executed outcome); otherwise Outcome.Kind is derived from it (see
// [OutcomeKind]).
func (r *Runner) Execute(ctx context.Context, flow AnyFlow, req Request) (*Outcome, error) {
	return r.executeWith(ctx, flow, req, nil)
}

// executeWith is Execute; stored, when set, is the input as stored with the
// key (the completer's, see storedInput), used instead of req.Params: it
// resumes an existing key and never creates one.
func (r *Runner) executeWith(ctx context.Context, flow AnyFlow, req Request, stored *prepared) (*Outcome, error) {
	started := time.Now()
	ctx, end := r.startRequest(ctx, flow.Name(), req.Scope)
	out, err := r.execute(ctx, flow, req, stored)
	if req.Wait > 0 && errors.Is(err, ErrInProgress) && out.Record != nil && r.enterWait(ctx, req) {
		func() {
			// Deferred: a panic that leaves the wait must not keep it
			// counted against Config.MaxWaiters for good.
			defer r.waiting.Add(-1)
			out, err = r.waitAndExecute(ctx, flow, req, stored, out, err, started)
		}()
	}
	err = callerGone(ctx, err)
	out.settle(err)
	end(out, err)
	if out.Kind == OutcomeExecuted {
		r.emit(ctx, Event{Kind: EventFinished, Flow: flow.Name(), Scope: req.Scope, Key: req.Key, Duration: time.Since(started)})
	}
	return out, err
}

// storeContext bounds one of the runner's own round trips to the store by
// Config.StatementTimeout.
func (r *Runner) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.config.StatementTimeout)
}

// storeError classifies the error of a store call made under storeContext:
// a deadline the runner set is the store not answering in time, which is
// ErrStoreUnavailable; the caller's own cancellation stays a context error.
func (r *Runner) storeError(ctx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrStoreUnavailable) {
		return fmt.Errorf("%w: no answer within %s: %w", ErrStoreUnavailable, r.config.StatementTimeout, err)
	}
	return err
}

// localNow is this process's clock for lease arithmetic (self-fencing): the
// test clock when Config.Test.Now is set.
func (r *Runner) localNow() time.Time {
	if r.config.Test.Now != nil {
		return r.config.Test.Now()
	}
	return time.Now()
}

func (r *Runner) now() *time.Time {
	if r.config.Test.Now == nil {
		return nil
	}
	t := r.config.Test.Now()
	return &t
}

func (r *Runner) emit(ctx context.Context, e Event) {
	if r.config.Observer != nil {
		e.Err = r.redact(e.Err)
		r.config.Observer.Observe(ctx, e)
	}
}

func (r *Runner) startRequest(ctx context.Context, flow, scope string) (context.Context, func(*Outcome, error)) {
	if t, ok := r.config.Observer.(Tracer); ok {
		ctx, end := t.StartRequest(ctx, flow, scope)
		return ctx, func(out *Outcome, err error) { end(out, r.redact(err)) }
	}
	return ctx, func(*Outcome, error) {}
}

func (r *Runner) startPhase(ctx context.Context, flow, phase string, attempt int) (context.Context, func(error)) {
	if t, ok := r.config.Observer.(Tracer); ok {
		ctx, end := t.StartPhase(ctx, flow, phase, attempt)
		return ctx, func(err error) { end(r.redact(err)) }
	}
	return ctx, func(error) {}
}
