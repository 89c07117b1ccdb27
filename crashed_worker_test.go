package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// swallowingFlow's charge phase turns every error of its foreign call into
// an answer (a 402), as a handler that maps provider errors does; so it
// also turns a simulated crash into one. seen records what Attempt.Now said
// in each phase.
func swallowingFlow(t *testing.T, name string, second bool, seen *sync.Map) *idem.Flow[rideInput] {
	t.Helper()
	return idem.MustNewFlow(name, []idem.Phase[rideInput]{
		{Name: "created", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
			seen.Store("created", run.Now())
			return idem.Advance(), nil
		}},
		{Name: "charged", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
			seen.Store("charged", run.Now())
			err := run.Foreign(ctx, "charge", func(ctx context.Context, key string) error { return nil })
			if err != nil {
				return idem.RespondJSON(http.StatusPaymentRequired, map[string]any{"error": err.Error()}), nil
			}
			if second {
				// A second call, refused by the runner, whose error the
				// phase logs and ignores.
				_ = run.Foreign(ctx, "email", func(ctx context.Context, key string) error { return nil })
			}
			return idem.RespondJSON(http.StatusCreated, map[string]any{"ok": true}), nil
		}},
	}, nil)
}

func TestASimulatedCrashCommitsNothingWhateverThePhaseReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	flow := swallowingFlow(t, "rides.swallow", false, &sync.Map{})
	var afterCrash []idemtest.HookWhere
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}, Test: idemtest.WithHook(idem.TestConfig{Now: b.clock.Now}, func(ctx context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterForeign {
			return idemtest.ErrSimulatedCrash
		}
		if at.Phase == "charged" && at.Where != idemtest.HookPhaseStart && at.Where != idemtest.HookBeforeForeign {
			afterCrash = append(afterCrash, at.Where)
		}
		return nil
	})})

	_, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "a"}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	require.Empty(t, afterCrash, "a dead worker reaches no later point")

	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, "created", rec.RecoveryPoint, "the phase that got the crash from Foreign committed nothing")
	require.NotNil(t, rec.LockedAt, "a dead worker releases nothing")
}

func TestAttemptNowIsTheRunnersClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	seen := &sync.Map{}
	flow := swallowingFlow(t, "rides.clock", false, seen)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}, Test: idemtest.WithHook(idem.TestConfig{Now: b.clock.Now}, func(ctx context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterCommit && at.Phase == "created" {
			b.clock.Advance(25 * time.Hour)
		}
		return nil
	})})
	start := b.clock.Now()
	_, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "a"}))
	require.NoError(t, err)
	created, _ := seen.Load("created")
	charged, _ := seen.Load("charged")
	require.Equal(t, start, created)
	require.Equal(t, start.Add(25*time.Hour), charged)
}

func TestARefusedForeignCallReachesTheHook(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	flow := swallowingFlow(t, "rides.second", true, &sync.Map{})
	var mu sync.Mutex
	var refused []idemtest.HookPoint
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}, Test: idemtest.WithHook(idem.TestConfig{Now: b.clock.Now}, func(ctx context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookForeignRefused {
			mu.Lock()
			refused = append(refused, at)
			mu.Unlock()
		}
		return nil
	})})
	out, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "a"}))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, out.Response.Status, "the runner only refuses the call; the phase decides")
	require.Len(t, refused, 1)
	require.Equal(t, "charged", refused[0].Phase)
	require.Equal(t, "email", refused[0].Foreign)
	require.True(t, errors.Is(refused[0].Err, idem.ErrSecondForeignCall), "%v", refused[0].Err)
}
