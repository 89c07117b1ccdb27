package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// Request.Acquired is called once the call holds the key, before its first
// phase runs: for a key it created and for one it took over, with the record
// it holds; never for a replay, a key in flight or a mismatch.
func TestAcquiredIsCalledOnceTheKeyIsHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, nil)
	ctx := context.Background()
	var held []*idemtype.KeyRecord
	phasesAtAcquisition := -1
	acquired := func(rec *idemtype.KeyRecord) {
		held = append(held, rec)
		phasesAtAcquisition = len(b.counts.Get())
	}

	req := b.request("k-1", rideInput{Origin: "SFO", Amount: 20})
	req.Acquired = acquired
	_, err := r.Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Len(t, held, 1, "a created key")
	require.Zero(t, phasesAtAcquisition, "called before the first phase")
	require.Equal(t, "k-1", held[0].Key)
	require.Equal(t, idemtype.RecoveryPointStarted, held[0].RecoveryPoint)

	out, err := r.Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	other := req
	other.Params = rideInput{Origin: "LAX", Amount: 20}
	_, err = r.Execute(ctx, b.flow, other)
	require.ErrorIs(t, err, idem.ErrMismatch)
	require.Len(t, held, 1, "a replay and a mismatch hold nothing")

	// A failed attempt leaves the key to its retry, which takes it over.
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		delete(b.hooks, "charge_created")
		return errors.New("provider down")
	}
	req2 := b.request("k-2", rideInput{Origin: "SFO", Amount: 20})
	req2.Acquired = acquired
	_, err = r.Execute(ctx, b.flow, req2)
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	_, err = r.Execute(ctx, b.flow, req2)
	require.NoError(t, err)
	require.Len(t, held, 3, "a created key, then its takeover")
	require.Equal(t, "ride_created", held[2].RecoveryPoint, "the takeover holds the key at its recovery point")
}

// A request that finds its key in flight is not told it holds it.
func TestAcquiredIsNotCalledForAKeyInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req := b.request("k-1", rideInput{Origin: "SFO", Amount: 20})
	_, release := startPausedIn(t, b, "charge_created", nil, req)
	defer release()
	called := false
	req.Acquired = func(*idemtype.KeyRecord) { called = true }
	_, err := b.runner(t, nil).Execute(context.Background(), b.flow, req)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.False(t, called)
}
