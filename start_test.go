package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// Start runs the maintenance services of Config.Maintenance in the
// background (here the completer finishes a request its client abandoned)
// until Stop, which waits for them; a second Start while they run is
// refused; Stop is idempotent, and a stopped runner starts again.
func TestStartRunsTheMaintenanceServicesUntilStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.abandon(t, "k1")
	b.clock.Advance(10 * time.Minute)

	completed := make(chan struct{}, 1)
	obs := newCountingObserver()
	obs.onEvent = func(e idem.Event) {
		if e.Kind == idem.EventCompleted {
			select {
			case completed <- struct{}{}:
			default:
			}
		}
	}
	r := b.runner(t, &idem.Config{Observer: obs, Maintenance: &idem.MaintainerConfig{
		CompleteInterval: 5 * time.Millisecond, Complete: idem.CompleteConfig{IdleFor: time.Minute},
	}})
	require.NoError(t, r.Stop(ctx), "Stop before Start does nothing")
	require.NoError(t, r.Start(ctx))
	require.ErrorIs(t, r.Start(ctx), idem.ErrRunnerStarted)
	select {
	case <-completed:
	case <-time.After(time.Minute):
		t.Fatal("the completer Start started did not complete the abandoned request")
	}
	require.NoError(t, r.Stop(ctx))
	require.Equal(t, idemtype.StoredFinished, b.key(t, "k1").Status)
	require.Equal(t, 1, b.provider.Charges())
	require.Equal(t, 1, obs.n(idem.EventCompleted))
	require.NoError(t, r.Stop(ctx))

	require.NoError(t, r.Start(ctx), "a stopped runner starts again")
	require.NoError(t, r.Stop(ctx))
}

// Start refuses a maintenance config that cannot run: a runner without
// flows cannot complete or reconcile keys, unless those services are
// disabled.
func TestStartRefusesMaintenanceWithoutFlows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r, err := idem.NewRunner(b.storeFor(t), nil)
	require.NoError(t, err)
	require.ErrorIs(t, r.Start(ctx), idem.ErrUnknownFlow)

	r, err = idem.NewRunner(b.storeFor(t), &idem.Config{Maintenance: &idem.MaintainerConfig{CompleteInterval: -1, ReconcileInterval: -1}})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx), "the reaper alone needs no flows")
	require.NoError(t, r.Stop(ctx))
}

// Stop returns when its context ends before the services stopped, with the
// context's error; they stop on their own, and a later Stop waits for them.
func TestStopGivesUpWithItsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, nil)
	require.NoError(t, r.Start(context.Background()))
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.Stop(ended), context.Canceled)
	require.NoError(t, r.Stop(context.Background()))
}
