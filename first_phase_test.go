package idem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// A new key commits on its own before its first phase: a worker that dies
// in that phase leaves the key, at its start and leased, for operators, the
// completer and a retry once the lease ran out. The key was created once.
func TestNewKeyCommitsBeforeItsFirstPhase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	req := b.request("k1", rideInput{Origin: "SF", Amount: 5})
	var mu sync.Mutex
	created := 0
	crash := b.runner(t, &idem.Config{
		Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookBeforeCommit, "ride_created")),
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventCreated {
				mu.Lock()
				created++
				mu.Unlock()
			}
		}),
	})
	_, err := crash.Execute(ctx, b.flow, req)
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	require.Equal(t, 1, created)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.RecoveryPointStarted, rec.RecoveryPoint, "the key committed before the phase")
	require.NotNil(t, rec.LockedAt, "a crash releases nothing")
	require.Zero(t, b.countRows(t, "rides"), "the phase's writes rolled back")

	b.clock.Advance(2 * time.Minute)
	out, err := b.runner(t, nil).Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, rec.ID, out.Record.ID, "the same key, resumed")
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())
}

// While a key's first phase runs, the key is there: a duplicate is in
// progress at once, with the key to show and when to retry; another body
// is a mismatch, then and once the key finished, which replays.
func TestDuplicateDuringTheFirstPhase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	req := b.request("k1", rideInput{Origin: "SF", Amount: 20})
	done, release := startPausedIn(t, b, "ride_created", nil, req)

	// A duplicate kept waiting for the phase would wait for release, which
	// only comes after these: the deadline turns such a wait into a failure.
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r := b.runner(t, nil)
	out, err := r.Execute(dctx, b.flow, req)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, out.Kind)
	require.NotNil(t, out.Record, "the key is committed and shows")
	require.Equal(t, idemtype.RecoveryPointStarted, out.Record.RecoveryPoint)
	require.GreaterOrEqual(t, out.RetryAfter, time.Second)
	other := b.request("k1", rideInput{Origin: "LA", Amount: 20})
	out, err = r.Execute(dctx, b.flow, other)
	require.ErrorIs(t, err, idem.ErrMismatch, "another body is a mismatch at every moment")
	require.Equal(t, idem.OutcomeMismatch, out.Kind)

	release()
	require.NoError(t, (<-done).err)
	out, err = r.Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = r.Execute(ctx, b.flow, other)
	require.ErrorIs(t, err, idem.ErrMismatch)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
}

// A retry-only request (idemhttp sets RetryOnly for a body this release no
// longer decodes or validates) that arrives while the first attempt of its
// key runs its first phase is in progress, never "not found": the request
// is running and will charge, and a client told 4xx would fix its body and
// send it under a new key, to be charged twice. One that waits (Prefer:
// wait) waits for the first attempt and replays its response.
func TestRetryOnlyWhileTheFirstPhaseRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	body := []byte(`{"origin":"SF","amount":20}`)
	first := idem.Request{Scope: "user:1", Key: "k1", Method: "POST", Path: "/rides", Params: body}
	done, release := startPausedIn(t, b, "ride_created", nil, first)

	retry := idem.Request{Scope: "user:1", Key: "k1", Method: "POST", Path: "/rides", Payload: body, RetryOnly: true}
	out, err := b.runner(t, nil).Execute(ctx, b.flow, retry)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.NotErrorIs(t, err, idem.ErrNotFound)
	require.Equal(t, idem.OutcomeInProgress, out.Kind)

	inProgress := make(chan struct{}, 1)
	waiter := b.runner(t, &idem.Config{Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
		if e.Kind == idem.EventInProgress {
			select {
			case inProgress <- struct{}{}:
			default:
			}
		}
	})})
	waited := make(chan executed, 1)
	go func() {
		w := retry
		w.Wait = 5 * time.Minute
		out, err := waiter.Execute(ctx, b.flow, w)
		waited <- executed{out, err}
	}()
	select {
	case <-inProgress: // the waiting retry found the key in progress
	case w := <-waited:
		t.Fatalf("the waiting retry-only request ended while its key ran: %s: %v", w.out.Kind, w.err)
	}
	release()
	require.NoError(t, (<-done).err, "the first attempt runs to completion")
	w := <-waited
	require.NoError(t, w.err)
	require.Equal(t, idem.OutcomeReplayed, w.out.Kind)
	require.Positive(t, w.out.Waited)
	require.Equal(t, 1, b.provider.Charges(), "charged once, by the first attempt")
}

// A first phase that fails (its error, not a crash) leaves its key released,
// with the error, for the client's retry, the completer and `idem keys
// list`; its writes rolled back. The retry resumes the same key.
func TestFailedFirstPhaseIsRecordedOnItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	failing := true
	b.hooks["ride_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		if failing {
			return errors.New("the fraud check is down")
		}
		return nil
	}
	req := b.request("k1", rideInput{Origin: "SF", Amount: 5})
	_, err := b.runner(t, nil).Execute(ctx, b.flow, req)
	require.ErrorContains(t, err, "the fraud check is down")
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, idemtype.RecoveryPointStarted, rec.RecoveryPoint)
	require.Nil(t, rec.LockedAt, "released")
	require.Contains(t, rec.LastError, "the fraud check is down")
	require.Equal(t, int64(1), rec.Fence)
	require.Zero(t, b.countRows(t, "rides"))

	failing = false
	out, err := b.runner(t, nil).Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, rec.ID, out.Record.ID, "the recorded key, resumed")
	require.Equal(t, 1, b.countRows(t, "rides"))
}
