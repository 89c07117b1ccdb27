package ridesapp_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// The tests below port rocket-rides-atomic's spec/completer_spec.rb and
// spec/reaper_spec.rb to idem's completer (Runner.Complete) and reaper
// (Runner.Reap), which serve runs through idem.Maintainer.

var completeConfig = &idem.CompleteConfig{IdleFor: time.Minute}

// abandon sends a ride request whose server dies at the start of phase,
// leaving the key locked, as a killed process would.
func abandon(t *testing.T, b *testBundle, phase string) string {
	t.Helper()
	key := newKey()
	b.crashAt(phase, idemtest.HookPhaseStart)
	_, err := b.post(t, "Bearer "+ridesapp.GoodUserEmail, key, validBody)
	require.Error(t, err)
	b.setHook(nil)
	return key
}

// "pushes through an existing idempotency key": a request whose client
// gave up is finished server-side, and the client's late retry gets the
// replay.
func TestCompleterPushesThroughAnAbandonedKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	key := abandon(t, b, ridesapp.PhaseRideCreated)
	b.clock.Advance(b.app.Runner().Config().Lease + completeConfig.IdleFor)

	res, err := b.app.Runner().Complete(ctx, completeConfig)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Completed: 1}, res)
	rec := b.key(t, b.goodUserID, key)
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, http.StatusCreated, rec.ResponseStatus)

	// No client took part, so the audit record has no origin address.
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM audit_records WHERE origin_ip IS NULL`))

	resp := b.ride(t, key)
	require.Equal(t, "true", resp.header.Get("Idempotent-Replayed"))
	require.Equal(t, rec.ResponseBody, resp.body)
	requireOneRide(t, b, key, resp.ride(t))
}

// "doesn't crash even on internal API exception": the pass counts the
// failure and goes on; the key passed one more phase and waits for the
// next pass.
func TestCompleterDoesNotCrashOnAnInternalError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	key := abandon(t, b, ridesapp.PhaseRideCreated)
	b.clock.Advance(b.app.Runner().Config().Lease + completeConfig.IdleFor)
	b.payments.failWith(errInternal)

	res, err := b.app.Runner().Complete(ctx, completeConfig)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Failed: 1}, res)
	rec := b.key(t, b.goodUserID, key)
	require.Equal(t, ridesapp.PhaseRideCreated, rec.RecoveryPoint)
	require.Nil(t, rec.LockedAt)

	b.payments.failWith(nil)
	b.clock.Advance(completeConfig.IdleFor + time.Second)
	res, err = b.app.Runner().Complete(ctx, completeConfig)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed)
	require.Len(t, b.provider.Charges(), 1)
}

// "ignores keys not yet within the completer's threshold" and "ignores keys
// that have been run recently" (idem has one threshold, IdleFor since the
// last run), "ignores finished keys" and "no-ops on an empty database".
func TestCompleterIgnoresKeysItShouldNotTouch(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	res, err := b.app.Runner().Complete(ctx, completeConfig)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{}, res, "an empty database")

	finished := newKey()
	b.ride(t, finished).ride(t)
	key := abandon(t, b, ridesapp.PhaseChargeCreated)
	b.clock.Advance(b.app.Runner().Config().Lease + time.Second)

	res, err = b.app.Runner().Complete(ctx, &idem.CompleteConfig{IdleFor: time.Hour})
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{}, res, "the abandoned key ran recently, the other is finished")
	require.Equal(t, ridesapp.PhaseRideCreated, b.key(t, b.goodUserID, key).RecoveryPoint)
	require.Len(t, b.provider.Charges(), 1)
}

// The reaper's spec, and what rocket-rides-atomic's schema promised but
// never tested: reaping a key a ride still references leaves the ride.
func TestReaperDeletesExpiredKeysAndTheRideSurvives(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	runner := b.app.Runner()

	res, err := runner.Reap(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Deleted, "an empty database")

	key := newKey()
	ride := b.ride(t, key).ride(t)
	abandoned := abandon(t, b, ridesapp.PhaseChargeCreated)

	res, err = runner.Reap(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Deleted, "within retention")

	b.clock.Advance(runner.Config().Retention + time.Second)
	res, err = runner.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Deleted, "the expired finished key, never the unfinished one")
	b.noKey(t, b.goodUserID, key)
	require.Equal(t, idemtype.StoredRunning, b.key(t, b.goodUserID, abandoned).Status)

	// The ride outlives its key, with everything recorded about it.
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM rides WHERE id = $1 AND idempotency_key_id IS NULL AND charge_id = $2`, ride.RideID, ride.ChargeID))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM audit_records WHERE resource_id = $1`, ride.RideID))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM river_job WHERE (args->>'ride_id')::bigint = $1`, ride.RideID))

	// After its retention a key is forgotten: the same key with another
	// request is a new request, not a mismatch. (The same request again is
	// still the same request to the provider: see
	// TestTheSameRequestAfterItsKeyWasReapedIsNotChargedTwice.)
	again := b.postOK(t, "Bearer "+ridesapp.GoodUserEmail, key, otherBody).ride(t)
	require.NotEqual(t, ride.RideID, again.RideID)
	require.NotEqual(t, ride.ChargeID, again.ChargeID)
}

// The same request re-sent after its key was reaped is still the same
// request to the provider: its downstream key and its charge's parameters
// are derived from the request, so the provider (which never forgets)
// returns the first charge. That charge is the first ride's, and a charge
// is recorded on one ride only, so the charge phase fails rather than book
// a second ride on the first one's payment: nobody is charged twice, and the
// key is left unfinished for an operator.
func TestTheSameRequestAfterItsKeyWasReapedIsNotChargedTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	runner := b.app.Runner()
	key := newKey()
	first := b.ride(t, key).ride(t)
	b.clock.Advance(runner.Config().Retention + time.Second)
	res, err := runner.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Deleted)

	resp := b.ride(t, key)
	require.Equal(t, http.StatusInternalServerError, resp.status, "%s", resp.body)
	require.Len(t, b.provider.Charges(), 1, "the provider recognised the request")
	require.Equal(t, first.ChargeID, b.provider.Charges()[0].ID)
	rec := b.key(t, b.goodUserID, key)
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, ridesapp.PhaseRideCreated, rec.RecoveryPoint)
	require.Contains(t, rec.LastError, "rides_charge_id_key")
}
