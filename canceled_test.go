package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/testfixture"
)

// A caller whose context is already cancelled gets a context error and
// OutcomeCanceled: not a phase failure, not the store being down, and no
// store_error event or error log line.
func TestCancelledCallerBeforeAcquisitionIsCanceled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := newCountingObserver()
	var logs testfixture.Buffer
	r := b.runner(t, &idem.Config{Observer: obs, Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := r.Execute(ctx, b.flow, b.request("gone-early", rideInput{Origin: "a", Amount: 10}))
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, idem.ErrPhaseFailed)
	require.NotErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Equal(t, idem.OutcomeCanceled, out.Kind)
	require.Zero(t, obs.n(idem.EventStoreError))
	require.NotContains(t, logs.String(), `"level":"ERROR"`)
	require.Zero(t, b.counts.Get()["ride_created"])

	// Nothing was written: the same key runs afresh.
	out, err = r.Execute(context.Background(), b.flow, b.request("gone-early", rideInput{Origin: "a", Amount: 10}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.False(t, out.TookOver)
}

// A caller that goes away in the middle of a phase: the phase rolls back,
// the key is released, the outcome is canceled (no phase_failed event, no
// warning), and the retry resumes after the phases that committed.
func TestCallerCancellingMidPhaseIsCanceledAndResumable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := newCountingObserver()
	var logs testfixture.Buffer
	r := b.runner(t, &idem.Config{Observer: obs, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})

	ctx, cancel := context.WithCancelCause(context.Background())
	gone := errors.New("client closed the connection")
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		cancel(gone)
		_, err := tx.Exec(ctx, `SELECT 1`) // cut short by the cancellation
		return err
	}
	in := rideInput{Origin: "a", Amount: 10}
	out, err := r.Execute(ctx, b.flow, b.request("gone-mid-phase", in))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, gone, "the cancellation's cause is kept")
	require.Equal(t, idem.OutcomeCanceled, out.Kind)
	require.Zero(t, obs.n(idem.EventPhaseFailed))
	require.Zero(t, obs.n(idem.EventStoreError))
	require.NotContains(t, logs.String(), `"level":"ERROR"`)
	require.NotContains(t, logs.String(), `"level":"WARN"`)
	require.Contains(t, logs.String(), "the caller went away")

	rec := b.key(t, "gone-mid-phase")
	require.Equal(t, "ride_created", rec.RecoveryPoint)
	require.Nil(t, rec.LockedAt, "the key was released for the retry")
	require.Equal(t, 0, b.countRows(t, "rides WHERE charge_id IS NOT NULL"))

	delete(b.hooks, "charge_created")
	out, err = r.Execute(context.Background(), b.flow, b.request("gone-mid-phase", in))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, 1, b.counts.Get()["ride_created"])
	require.Equal(t, 1, b.countRows(t, "rides"))
}

// A phase's own context error (a provider call on a context of its own that
// was cancelled) is a phase failure while the caller is still there.
func TestPhaseContextErrorWithTheCallerThereIsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		return fmt.Errorf("provider call: %w", context.Canceled)
	}
	out, err := r.Execute(context.Background(), b.flow, b.request("provider-cancelled", rideInput{Origin: "a", Amount: 10}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
}

// Reconcile, like Execute: a caller already gone is canceled, not a store
// error.
func TestCancelledCallerOfReconcileIsCanceled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := newCountingObserver()
	r := b.runner(t, &idem.Config{Observer: obs, Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := r.Reconcile(ctx, "user:1", "whatever")
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, idem.OutcomeCanceled, out.Kind)
	require.Zero(t, obs.n(idem.EventStoreError))
}
