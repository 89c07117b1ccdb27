package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/testfixture"
)

// The reaper ends unfinished keys abandoned past their flow's UnfinishedRetention
// (counted from the key's creation) by deleting them, and never a key a
// live lease holds or one that needs reconciliation.
func TestReapEndsAbandonedKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	// Keys created 25 hours ago.
	b.insertKeys(t, "stale", 5, idemtype.KeyStateStale, now)
	b.insertKeys(t, "running", 3, idemtype.KeyStateRunning, now) // leases live for another hour
	b.insertKeys(t, "reconcile", 2, idemtype.KeyStateNeedsReconcile, now)
	b.insertKeys(t, "live", 2, idemtype.KeyStateFinished, now)
	_, err := b.pool.Exec(ctx, `INSERT INTO rides (key_id, origin) SELECT id, key FROM idem_keys`)
	require.NoError(t, err)
	count := func() map[string]int {
		return map[string]int{"stale": b.countKeys(t, "stale"), "running": b.countKeys(t, "running"),
			"reconcile": b.countKeys(t, "reconcile"), "live": b.countKeys(t, "live")}
	}

	// The default is a week: nothing 25 hours old is abandoned.
	res, err := b.runner(t, nil).Reap(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Unfinished)
	require.Equal(t, map[string]int{"stale": 5, "running": 3, "reconcile": 2, "live": 2}, count())

	// A flow that gives up after a day loses its stale keys, nothing else.
	obs := newCountingObserver()
	daily := b.rideFlowConfig("rides.create", &idem.FlowConfig[rideInput]{UnfinishedRetention: 24 * time.Hour})
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{daily}, Observer: obs})
	res, err = r.Reap(ctx, &idem.ReapConfig{BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, 5, res.Unfinished)
	require.Zero(t, res.Deleted)
	require.Equal(t, 5, obs.sum(idem.EventReapedUnfinished))
	require.Equal(t, map[string]int{"stale": 0, "running": 3, "reconcile": 2, "live": 2}, count())
	require.Equal(t, 12, b.countRows(t, "rides"), "business rows survive")
	require.Equal(t, 5, b.countRows(t, "rides WHERE key_id IS NULL"))

	// Two hours on, the leases of the running keys have expired: nobody
	// holds them, and they go too. Keys in needs_reconcile wait for a verdict.
	b.clock.Advance(2 * time.Hour)
	res, err = r.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 3, res.Unfinished)
	require.Equal(t, 2, res.Deleted, "the finished keys expired meanwhile")
	require.Equal(t, map[string]int{"stale": 0, "running": 0, "reconcile": 2, "live": 0}, count())

	// A negative UnfinishedRetention keeps keys forever.
	b.insertKeys(t, "kept", 2, idemtype.KeyStateStale, b.clock.Now().Add(-30*24*time.Hour))
	res, err = b.runner(t, &idem.Config{UnfinishedRetention: -1}).Reap(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Unfinished)
	require.Equal(t, 2, b.countKeys(t, "kept"))
	never := b.rideFlowConfig("rides.create", &idem.FlowConfig[rideInput]{UnfinishedRetention: -1})
	res, err = b.runner(t, &idem.Config{Flows: []idem.AnyFlow{never}}).Reap(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Unfinished)
	res, err = b.runner(t, nil).Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 2, res.Unfinished, "the week's default")
}

// A key whose request keeps failing is abandoned a week after it was
// created, however often it is retried; a key held by a live lease never
// is. A request with the key after that runs as a new request.
func TestAbandonedKeyIsEndedAfterAWeek(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	failing := errors.New("provider down")
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error { return failing }
	r := b.runner(t, nil)
	req := b.request("k1", rideInput{Origin: "SF", Amount: 5})
	for day := range 7 {
		_, err := r.Execute(ctx, b.flow, req)
		require.ErrorIs(t, err, failing)
		b.clock.Advance(24 * time.Hour)
		if day == 6 {
			b.clock.Advance(-time.Second)
		}
		res, err := r.Reap(ctx, nil)
		require.NoError(t, err)
		require.Zero(t, res.Unfinished, "retried every day, not abandoned yet")
	}
	b.clock.Advance(time.Second) // a week after its creation
	res, err := r.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Unfinished)
	require.Zero(t, b.countRows(t, "idem_keys"))

	// A live lease protects a key however old it is.
	pause := testfixture.NewPause(t)
	delete(b.hooks, "charge_created")
	b.hooks["ride_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		pause.Hold(context.Background())
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Execute(ctx, b.flow, b.request("k2", rideInput{Origin: "SF", Amount: 5}))
		done <- err
	}()
	<-pause.Reached()
	b.clock.Advance(30 * 24 * time.Hour)
	_, err = b.pool.Exec(ctx, `INSERT INTO idem_leases AS l (scope, key_id, fence, locked_at, lease_expires_at)
		SELECT scope, id, fence, locked_at, $1::timestamptz + interval '1 hour' FROM idem_keys
		ON CONFLICT (scope, key_id) DO UPDATE SET lease_expires_at = excluded.lease_expires_at`, b.clock.Now())
	require.NoError(t, err) // as the heartbeat would
	res, err = r.Reap(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Unfinished)
	pause.Release()
	// The worker may go on, or, having seen a month pass since it last
	// renewed its lease, fence itself off before its foreign call; either
	// way the reaper left its key alone.
	if err := <-done; err != nil {
		require.ErrorIs(t, err, idem.ErrLockLost)
	}
	require.Equal(t, 1, b.countRows(t, "idem_keys"))
}

// Config.Admit caps the keys a scope may create: it is asked only before a
// new key would be created, so retries of existing keys are never refused,
// and its ErrTooManyKeys refuses the request with a retry delay and writes
// nothing.
func TestAdmitCapsNewKeysPerScope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// tenant:full created k1 before it hit its cap.
	_, err := b.runner(t, &idem.Config{Retention: time.Hour}).Execute(ctx, b.flow, idem.Request{Scope: "tenant:full", Key: "k1", Params: rideInput{Origin: "SF"}})
	require.NoError(t, err)
	_, err = b.runner(t, &idem.Config{Retention: 10 * time.Hour}).Execute(ctx, b.flow, idem.Request{Scope: "tenant:full", Key: "k2", Params: rideInput{Origin: "SF"}})
	require.NoError(t, err)

	var asked atomic.Int64
	broken := errors.New("quota service down")
	r := b.runner(t, &idem.Config{Admit: func(_ context.Context, scope, flow string) error {
		asked.Add(1)
		require.Equal(t, "rides.create", flow)
		switch scope {
		case "tenant:full":
			return idem.TooManyKeys(30 * time.Second)
		case "tenant:broken":
			return broken
		}
		return nil
	}})

	out, err := r.Execute(ctx, b.flow, idem.Request{Scope: "tenant:full", Key: "k3", Params: rideInput{Origin: "SF"}})
	require.ErrorIs(t, err, idem.ErrTooManyKeys)
	require.Equal(t, idem.OutcomeTooManyKeys, out.Kind)
	require.Equal(t, 30*time.Second, out.RetryAfter)
	require.Equal(t, int64(1), asked.Load())
	require.Equal(t, 2, b.countRows(t, "idem_keys"), "nothing written")

	// A retry of an existing key is never refused, nor even asked about.
	out, err = r.Execute(ctx, b.flow, idem.Request{Scope: "tenant:full", Key: "k2", Params: rideInput{Origin: "SF"}})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, int64(1), asked.Load())

	// An expired key is absent: reusing it is a new key, which is asked
	// about, and refused; the expired row is left as it was.
	b.clock.Advance(2 * time.Hour)
	out, err = r.Execute(ctx, b.flow, idem.Request{Scope: "tenant:full", Key: "k1", Params: rideInput{Origin: "SF"}})
	require.ErrorIs(t, err, idem.ErrTooManyKeys)
	require.Equal(t, idem.OutcomeTooManyKeys, out.Kind)
	require.Equal(t, int64(2), asked.Load())
	require.Equal(t, 2, b.countRows(t, "idem_keys"))

	// Other scopes are admitted; an admission hook that fails fails the
	// request, and writes nothing either.
	out, err = r.Execute(ctx, b.flow, idem.Request{Scope: "tenant:ok", Key: "k1", Params: rideInput{Origin: "SF"}})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	out, err = r.Execute(ctx, b.flow, idem.Request{Scope: "tenant:broken", Key: "k1", Params: rideInput{Origin: "SF"}})
	require.ErrorIs(t, err, broken)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	require.Equal(t, 3, b.countRows(t, "idem_keys"))
	require.Equal(t, int64(4), asked.Load())

	// ErrTooManyKeys on its own suggests a second.
	require.ErrorIs(t, idem.TooManyKeys(0), idem.ErrTooManyKeys)
	var tm *idem.TooManyKeysError
	require.ErrorAs(t, idem.TooManyKeys(0), &tm)
	require.Equal(t, time.Second, tm.RetryAfter)
}
