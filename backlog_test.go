package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// The backlog counts unfinished keys by status, and the age of the oldest
// in each from its creation: a needs_reconcile key a reconcile run keeps
// claiming (which moves its last_run_at) still shows its whole wait.
func TestBacklogCountsUnfinishedKeysByStatusWithTheOldestAge(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow, b.testBundle.flow}})

	empty, err := r.Backlog(ctx)
	require.NoError(t, err)
	require.Len(t, empty.Statuses, 2)
	require.Zero(t, empty.Keys(idemtype.StoredRunning))
	require.Zero(t, empty.OldestAge(idemtype.StoredNeedsReconcile))

	b.gateway.lose = true
	_, err = r.Execute(ctx, b.flow, b.req("doubt"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	b.clock.Advance(10 * time.Minute)
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error { return errors.New("provider down") }
	_, err = r.Execute(ctx, b.testBundle.flow, b.testBundle.request("failing", rideInput{Origin: "a"}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	_, err = r.Execute(ctx, b.flow, b.req("done"))
	require.NoError(t, err)
	b.clock.Advance(5 * time.Minute)
	b.gateway.unknown = true
	res, err := r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	require.Equal(t, 1, res.Unresolved)

	got, err := r.Backlog(ctx)
	require.NoError(t, err)
	t.Logf("backlog: running=%d (oldest %s), needs_reconcile=%d (oldest %s)",
		got.Keys(idemtype.StoredRunning), got.OldestAge(idemtype.StoredRunning),
		got.Keys(idemtype.StoredNeedsReconcile), got.OldestAge(idemtype.StoredNeedsReconcile))
	require.EqualValues(t, 1, got.Keys(idemtype.StoredRunning))
	require.EqualValues(t, 1, got.Keys(idemtype.StoredNeedsReconcile))
	require.Equal(t, 5*time.Minute, got.OldestAge(idemtype.StoredRunning))
	require.Equal(t, 15*time.Minute, got.OldestAge(idemtype.StoredNeedsReconcile), "from creation, not from the last reconcile try")
}
