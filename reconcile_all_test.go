package idem_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// Reconcile runs over every idle needs_reconcile key: a hook that cannot
// tell leaves them for the next run, IdleFor later; verdicts carry each
// flow to its response, and each message is sent exactly once.
func TestReconcileAllResolvesIdleKeys(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	keys := []string{"k1", "k2", "k3"}
	for _, key := range keys {
		b.gateway.lose = true // the send fails before reaching the gateway
		_, err := r.Execute(ctx, b.flow, b.req(key))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	}
	cfg := &idem.ReconcileConfig{IdleFor: time.Minute, BatchSize: 2}

	res, err := r.ReconcileAll(ctx, cfg)
	require.NoError(t, err)
	require.Zero(t, res.Claimed, "just put in needs_reconcile: not idle yet")

	obs := newCountingObserver()
	observed := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Observer: obs})
	b.clock.Advance(2 * time.Minute)
	b.gateway.unknown = true
	res, err = observed.ReconcileAll(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 3, Unresolved: 3}, res)
	require.Equal(t, 3, obs.n(idem.EventNeedsReconcile))
	require.Equal(t, 3, obs.n(idem.EventReconciled))

	res, err = observed.ReconcileAll(ctx, cfg)
	require.NoError(t, err)
	require.Zero(t, res.Claimed, "asked a minute ago: wait IdleFor before asking again")

	b.clock.Advance(2 * time.Minute)
	b.gateway.unknown = false
	res, err = observed.ReconcileAll(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 3, Resolved: 3}, res)
	for _, key := range keys {
		require.Equal(t, idemtype.StoredFinished, b.key(t, key).Status, key)
		require.Equal(t, 1, b.gateway.times(b.ref(t, key)), key)
	}

	// MaxKeys bounds a pass.
	for i := range 3 {
		b.gateway.lose = true
		_, err := r.Execute(ctx, b.flow, b.req(fmt.Sprint("later-", i)))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	}
	b.clock.Advance(2 * time.Minute)
	res, err = r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: time.Minute, BatchSize: 2, MaxKeys: 1})
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 1, Resolved: 1}, res)
}
