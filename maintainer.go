package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// A Maintainer runs the three operations services inside an application, each
// on its own interval: the reaper ([Runner.Reap]), the completer
// ([Runner.Complete]) and reconcile runs ([Runner.ReconcileAll]). Run one in
// every instance of the application; they coordinate through the database,
// not with each other:
//
//	runner, _ := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{rides}, Logger: logger})
//	maint, _ := idem.NewMaintainer(runner, nil)
//	go func() { _ = maint.Serve(ctx) }() // returns once ctx is done
//
// Every instance may run every service: a reaper batch deletes rows no other
// batch is deleting (SKIP LOCKED), and the completer and reconcile runs claim
// disjoint sets of keys, so no key is completed or reconciled twice however
// many instances run. More instances only shorten the time a backlog takes.

// MaintainerConfig configures a [Maintainer]. The zero value runs all three
// services with their defaults.
type MaintainerConfig struct {
	// ReapInterval is the time between reaper passes. Default ReapIntervalDefault (5m); negative
	// disables the reaper in this instance.
	ReapInterval time.Duration
	// CompleteInterval is the time between completer passes. Default CompleteIntervalDefault (1m);
	// negative disables the completer.
	CompleteInterval time.Duration
	// ReconcileInterval is the time between reconcile passes. Default ReconcileIntervalDefault (1m);
	// negative disables reconcile runs.
	ReconcileInterval time.Duration

	// Reap, Complete and Reconcile configure each pass; zero values use
	// their defaults.
	Reap      ReapConfig
	Complete  CompleteConfig
	Reconcile ReconcileConfig
}

// Defaults of [MaintainerConfig]'s intervals.
const (
	ReapIntervalDefault      = 5 * time.Minute
	CompleteIntervalDefault  = time.Minute
	ReconcileIntervalDefault = time.Minute
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *MaintainerConfig) WithDefaults() *MaintainerConfig {
	out := &MaintainerConfig{}
	if c != nil {
		*out = *c
	}
	out.ReapInterval = cmp.Or(out.ReapInterval, ReapIntervalDefault)
	out.CompleteInterval = cmp.Or(out.CompleteInterval, CompleteIntervalDefault)
	out.ReconcileInterval = cmp.Or(out.ReconcileInterval, ReconcileIntervalDefault)
	out.Reap = *out.Reap.WithDefaults()
	out.Complete = *out.Complete.WithDefaults()
	out.Reconcile = *out.Reconcile.WithDefaults()
	return out
}

func (c *MaintainerConfig) validate(r *Runner) error {
	var errs []error
	if c.ReapInterval > 0 {
		errs = append(errs, c.Reap.validate())
	}
	if c.CompleteInterval > 0 {
		errs = append(errs, c.Complete.validate())
	}
	if c.ReconcileInterval > 0 {
		errs = append(errs, c.Reconcile.validate())
	}
	if len(r.flows) == 0 && (c.CompleteInterval > 0 || c.ReconcileInterval > 0) {
		errs = append(errs, fmt.Errorf("the runner has no flows in Config.Flows, so it cannot complete or reconcile keys: "+
			"register the application's flows, or disable those services with a negative interval: %w", ErrUnknownFlow))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idem: invalid maintainer config: %w", err)
	}
	return nil
}

// ErrMaintainerRunning is returned by [Maintainer.Serve] when the maintainer is
// already running.
var ErrMaintainerRunning = errors.New("idem: maintainer already running")

// Maintainer runs the reaper, the completer and reconcile runs on intervals.
// Make one per application instance with [NewMaintainer] and call Serve.
type Maintainer struct {
	runner  *Runner
	config  *MaintainerConfig
	log     *slog.Logger
	running atomic.Bool
}

// NewMaintainer returns a maintainer for runner. A nil config means the
// defaults. The completer and reconcile runs need the application's flows in
// the runner's Config.Flows; NewMaintainer refuses a runner without flows
// unless both are disabled.
func NewMaintainer(runner *Runner, config *MaintainerConfig) (*Maintainer, error) {
	if runner == nil {
		return nil, errors.New("idem: NewMaintainer needs a runner")
	}
	cfg := config.WithDefaults()
	if err := cfg.validate(runner); err != nil {
		return nil, err
	}
	// The passes log through the runner's logger (Config.Logger), as the
	// requests they complete do; the maintainer's own lines say which
	// component wrote them.
	return &Maintainer{runner: runner, config: cfg, log: runner.log.With("component", "idem.maintainer")}, nil
}

// Config returns the maintainer's configuration with defaults applied. Treat
// it as read-only.
func (m *Maintainer) Config() *MaintainerConfig { return m.config }

// Serve runs every enabled service, each once at start and then every
// interval (with 10% jitter, so instances started together spread out),
// until ctx is done. It then waits for passes in flight to stop (a request
// being completed is interrupted as a client disconnect would interrupt it:
// its phase rolls back and the key is released) and returns nil. A failing
// pass is logged and retried at the next interval; it never stops Serve.
func (m *Maintainer) Serve(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrMaintainerRunning
	}
	defer m.running.Store(false)

	services := []struct {
		name     string
		interval time.Duration
		pass     func(context.Context) error
	}{
		{"reaper", m.config.ReapInterval, func(ctx context.Context) error {
			_, err := m.runner.Reap(ctx, &m.config.Reap)
			return err
		}},
		{"completer", m.config.CompleteInterval, func(ctx context.Context) error {
			_, err := m.runner.Complete(ctx, &m.config.Complete)
			return err
		}},
		{"reconciler", m.config.ReconcileInterval, func(ctx context.Context) error {
			_, err := m.runner.ReconcileAll(ctx, &m.config.Reconcile)
			return err
		}},
	}
	// Durations are logged as strings ("5m0s"): a JSON handler would write
	// a time.Duration as integer nanoseconds.
	m.log.InfoContext(ctx, "idem: maintainer started", "reap_interval", m.config.ReapInterval.String(),
		"complete_interval", m.config.CompleteInterval.String(), "reconcile_interval", m.config.ReconcileInterval.String())
	var wg sync.WaitGroup
	// Keys a deploy stranded (a phase renamed or removed undeclared) are
	// logged and counted once at start; a failure is left to the passes
	// to report.
	wg.Go(func() { _, _ = m.runner.CheckResumable(ctx) })
	if m.config.ReconcileInterval > 0 {
		// Keys in doubt this binary has no reconcile hook for are logged
		// once at start (CheckReconcileHooks); a failure is the next
		// reconcile pass's to report.
		wg.Go(func() { _, _ = m.runner.CheckReconcileHooks(ctx) })
	}
	for _, svc := range services {
		if svc.interval <= 0 {
			continue
		}
		wg.Go(func() { m.loop(ctx, svc.name, svc.interval, svc.pass) })
	}
	wg.Wait()
	m.log.InfoContext(context.WithoutCancel(ctx), "idem: maintainer stopped")
	return nil
}

func (m *Maintainer) loop(ctx context.Context, name string, interval time.Duration, pass func(context.Context) error) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		// A failing pass has logged its error (once: a pass that fails
		// every interval while the database is down must not log twice a
		// time) and emitted EventStoreError; the service carries on.
		_ = pass(ctx)
		timer.Reset(jitter(interval))
	}
}

// jitter spreads d by ±10%.
func jitter(d time.Duration) time.Duration {
	spread := int64(d) / 10
	if spread <= 0 {
		return d
	}
	return d - time.Duration(spread) + time.Duration(rand.Int64N(2*spread+1))
}
