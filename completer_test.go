package idem_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

var errProviderDown = errors.New("payment provider unreachable")

// crashAt returns a test hook that crashes the runner at one point of one
// phase, the way a killed process stops.
func crashAt(where idemtest.HookWhere, phase string) func(context.Context, idemtest.HookPoint) error {
	return func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == where && at.Phase == phase {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	}
}

// abandon runs a request that crashes right after its charge, leaving the key
// locked at ride_created with the provider already charged: the worst place
// for a client to give up.
func (b *testBundle) abandon(t *testing.T, key string) {
	t.Helper()
	crashing := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookAfterForeign, "charge_created"))})
	_, err := crashing.Execute(context.Background(), b.flow, b.request(key, rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
}

// The completer finishes a request its client abandoned after the charge:
// from the stored params, with exactly one charge, and a later client retry
// gets the stored response as a replay.
func TestCompleterFinishesAnAbandonedRequestWithOneCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.abandon(t, "k1")
	require.Equal(t, 1, b.provider.Charges())
	rec := b.key(t, "k1")
	require.Equal(t, "ride_created", rec.RecoveryPoint)
	require.NotNil(t, rec.LockedAt)

	obs := newCountingObserver()
	completer := b.runner(t, &idem.Config{Observer: obs})
	cfg := &idem.CompleteConfig{IdleFor: 5 * time.Minute}

	// The dead worker's lease is live: nothing to do.
	res, err := completer.Complete(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{}, res)

	// The lease expired, but the key has not been idle for IdleFor: a
	// client retry may well be on its way, so the completer leaves it.
	b.clock.Advance(2 * time.Minute)
	res, err = completer.Complete(ctx, cfg)
	require.NoError(t, err)
	require.Zero(t, res.Claimed)

	b.clock.Advance(4 * time.Minute)
	res, err = completer.Complete(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Completed: 1}, res)
	require.Equal(t, 1, obs.n(idem.EventCompleted))
	require.Equal(t, 1, obs.n(idem.EventTakeover))

	rec = b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, http.StatusCreated, rec.ResponseStatus)
	require.Equal(t, 1, b.provider.Charges(), "exactly one charge")
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.countRows(t, "jobs"))
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 2, "receipt_enqueued": 1}, b.counts.Get(),
		"the charge phase re-ran with the same downstream key; the ride was not created again")

	// The client comes back: it gets the stored response, byte for byte.
	out, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, rec.ResponseBody, out.Response.Body)

	// A second pass has nothing left.
	b.clock.Advance(time.Hour)
	res, err = completer.Complete(ctx, cfg)
	require.NoError(t, err)
	require.Zero(t, res.Claimed)
	require.Equal(t, 1, obs.n(idem.EventCompleted))
}

// The completer resumes keys released after a failed attempt too, picks
// only keys of flows it has, skips keys that failed MaxAttempts times, and
// never touches live, finished or needs_reconcile keys.
func TestCompleterPicksOnlyIdleRunningKeysOfItsFlows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()

	// Released after a phase error: unlocked, at ride_created.
	failing := b.runner(t, nil)
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error { return errProviderDown }
	out, err := failing.Execute(ctx, b.flow, b.request("released", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	require.Nil(t, b.key(t, "released").LockedAt)
	delete(b.hooks, "charge_created")

	b.insertKeys(t, "live", 3, idemtype.KeyStateRunning, now.Add(time.Hour)) // locked for an hour and more
	b.insertKeys(t, "finished", 3, idemtype.KeyStateFinished, now)
	b.insertKeys(t, "reconcile", 3, idemtype.KeyStateNeedsReconcile, now)
	b.insertKeys(t, "tried", 2, idemtype.KeyStateStale, now)
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET attempts = 10 WHERE key LIKE 'tried-%'`)
	require.NoError(t, err)
	other := b.rideFlow("rides.other")
	_, err = b.runner(t, &idem.Config{Flows: []idem.AnyFlow{other}, Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "charge_created"))}).
		Execute(ctx, other, b.request("other-flow", rideInput{Origin: "LA"}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)

	b.clock.Advance(10 * time.Minute)
	obs := newCountingObserver()
	res, err := b.runner(t, &idem.Config{Observer: obs}).Complete(ctx, &idem.CompleteConfig{IdleFor: time.Minute, BatchSize: 1})
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Completed: 1}, res)
	require.Equal(t, idemtype.StoredFinished, b.key(t, "released").Status)
	require.Equal(t, 1, b.provider.Charges())

	require.Equal(t, idemtype.StoredRunning, b.key(t, "other-flow").Status, "a flow this runner does not have is left alone")
	require.Equal(t, idemtype.StoredRunning, b.key(t, "tried-1").Status, "MaxAttempts leaves it for an operator")
	require.Equal(t, idemtype.StoredNeedsReconcile, b.key(t, "reconcile-1").Status)
	require.NotNil(t, b.key(t, "live-1").LockedAt)

	// Without a limit on attempts the tried keys are run too; their params
	// are the stored ones, here an input with only an origin, and the
	// flow carries them to the end.
	res, err = b.runner(t, nil).Complete(ctx, &idem.CompleteConfig{IdleFor: time.Minute, MaxAttempts: -1})
	require.NoError(t, err)
	require.Equal(t, 2, res.Claimed)
	require.Equal(t, 2, res.Completed)
}

// A running key whose not-idempotent call is in doubt is not re-run by the
// completer: it goes to needs_reconcile, and the next reconcile run resolves
// it, with the message sent once.
func TestCompleterHandsDoubtfulKeysToReconcile(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	_, err := b.runner(t, crashAt(idemtest.HookAfterForeign, "sms_sent")).Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	b.clock.Advance(10 * time.Minute)

	r := b.runner(t, nil)
	res, err := r.Complete(ctx, &idem.CompleteConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, NeedsReconcile: 1}, res)
	require.Equal(t, idemtype.StoredNeedsReconcile, b.key(t, "k1").Status)

	// The completer never picks it again; reconcile runs do, once it has
	// been idle long enough.
	b.clock.Advance(10 * time.Minute)
	res, err = r.Complete(ctx, &idem.CompleteConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	require.Zero(t, res.Claimed)

	rres, err := r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 1, Resolved: 1}, rres)
	require.Equal(t, idemtype.StoredFinished, b.key(t, "k1").Status)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "k1")))
	require.Equal(t, 1, b.counts.Get()["sms_sent"])
}

func TestCompleteAndReconcileNeedFlowsAndValidConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	bare, err := idem.NewRunner(b.storeFor(t), nil)
	require.NoError(t, err)
	_, err = bare.Complete(ctx, nil)
	require.ErrorIs(t, err, idem.ErrUnknownFlow)
	_, err = bare.ReconcileAll(ctx, nil)
	require.ErrorIs(t, err, idem.ErrUnknownFlow)

	r := b.runner(t, nil)
	for name, cfg := range map[string]*idem.CompleteConfig{
		"negative idle":  {IdleFor: -time.Second},
		"huge batch":     {BatchSize: 5000},
		"negative batch": {BatchSize: -1},
		"negative max":   {MaxKeys: -1},
	} {
		_, err := r.Complete(ctx, cfg)
		require.ErrorContains(t, err, "invalid complete config", name)
	}
	_, err = r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: -1})
	require.ErrorContains(t, err, "invalid reconcile config")

	def := (&idem.CompleteConfig{}).WithDefaults()
	require.Equal(t, &idem.CompleteConfig{IdleFor: 5 * time.Minute, BatchSize: 10, MaxAttempts: 10}, def)
	require.Equal(t, &idem.ReconcileConfig{IdleFor: time.Minute, BatchSize: 10}, (&idem.ReconcileConfig{}).WithDefaults())
}
