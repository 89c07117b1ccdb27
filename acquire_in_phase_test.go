package idem_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
)

// pauseIn makes the bundle's phase pause on its first run until the
// returned release is called; entered is closed once it paused.
func pauseIn(t *testing.T, b *testBundle, phase string) (entered <-chan struct{}, release func()) {
	t.Helper()
	in, out := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(out) })
	t.Cleanup(release) // a failing test must not leave the worker holding a connection
	var first atomic.Bool
	b.hooks[phase] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		if first.CompareAndSwap(false, true) {
			close(in)
			<-out
		}
		return nil
	}
	return in, release
}

// A new key commits with its first phase: a worker that dies before that
// commit leaves nothing, not even the key, and the retry starts clean. A
// flow that acquires separately leaves the key behind, at its start.
func TestNewKeyCommitsWithItsFirstPhase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	req := b.request("k1", rideInput{Origin: "SF", Amount: 5})

	crash := b.runner(t, &idem.Config{Test: idem.TestConfig{Hook: crashAt(idem.HookBeforeCommit, "ride_created")}})
	require.Equal(t, []string{"ride_created"}, crash.AcquisitionJoins(b.flow))
	_, err := crash.Execute(ctx, b.flow, req)
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	_, err = b.storeFor(t).GetKey(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrNotFound, "the key went with the first phase's transaction")
	require.Zero(t, b.countRows(t, "rides"))

	out, err := b.runner(t, nil).Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.False(t, out.TookOver, "a clean start, not a takeover")
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())

	separate := b.rideFlowConfig("rides.separate", &idem.FlowConfig[rideInput]{AcquireSeparately: true})
	crash = b.runner(t, &idem.Config{Flows: []idem.AnyFlow{separate}, Test: idem.TestConfig{Hook: crashAt(idem.HookBeforeCommit, "ride_created")}})
	require.Nil(t, crash.AcquisitionJoins(separate))
	_, err = crash.Execute(ctx, separate, b.request("k2", rideInput{Origin: "SF", Amount: 5}))
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	rec := b.key(t, "k2")
	require.Equal(t, idem.RecoveryPointStarted, rec.RecoveryPoint, "acquired separately, the key committed before the phase")
}

// While a key's first phase runs, the key is uncommitted: a duplicate, or
// any request with the key, is answered "in progress" at once, never kept
// waiting for the phase, whichever way it acquires. Once the phase commits,
// the key reads as usual: a retry is in progress, then replayed; other
// params are a mismatch.
func TestDuplicateOfAKeyBeingCreatedIsAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	entered, release := pauseIn(t, b, "ride_created")
	req := b.request("k1", rideInput{Origin: "SF", Amount: 20})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner(t, nil).Execute(ctx, b.flow, req)
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the first request ended before pausing: %v", err)
	}

	// A duplicate that waited for the phase would wait for release, which
	// only comes after these: the deadline turns such a wait into a failure.
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	separate := b.rideFlowConfig("rides.create", &idem.FlowConfig[rideInput]{AcquireSeparately: true})
	for name, tc := range map[string]struct {
		flow *idem.Flow[rideInput]
		in   rideInput
	}{
		"duplicate":                        {b.flow, req.Params.(rideInput)},
		"duplicate acquiring separately":   {separate, req.Params.(rideInput)},
		"other params, unknowable for now": {b.flow, rideInput{Origin: "LA", Amount: 20}},
	} {
		out, err := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{tc.flow}}).Execute(dctx, tc.flow, b.request("k1", tc.in))
		require.ErrorIs(t, err, idem.ErrInProgress, name)
		require.ErrorIs(t, err, idemdriver.ErrKeyBusy, name)
		require.Equal(t, idem.OutcomeInProgress, out.Kind, name)
		require.Nil(t, out.Record, "%s: nothing to show yet", name)
		require.Equal(t, time.Second, out.RetryAfter, name)
	}

	release()
	require.NoError(t, <-done)
	out, err := b.runner(t, nil).Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "LA", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrMismatch)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
}

// A duplicate that may wait (Request.Wait) for a key being created has no
// record to be woken by: it polls until the key is there, then waits for it
// as usual, and replays the first request's response.
func TestWaitingDuplicateOfAKeyBeingCreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	entered, release := pauseIn(t, b, "ride_created")
	req := b.request("k1", rideInput{Origin: "SF", Amount: 20})
	done := make(chan error, 1)
	go func() {
		_, err := b.runner(t, nil).Execute(ctx, b.flow, req)
		done <- err
	}()
	<-entered

	busy := make(chan struct{}, 64)
	waiter := b.runner(t, &idem.Config{Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
		if e.Kind == idem.EventInProgress {
			select {
			case busy <- struct{}{}:
			default:
			}
		}
	})})
	waited := make(chan *idem.Outcome, 1)
	go func() {
		w := req
		w.Wait = 5 * time.Minute
		out, err := waiter.Execute(ctx, b.flow, w)
		if err != nil {
			out = &idem.Outcome{Kind: idem.OutcomeFailed}
		}
		waited <- out
	}()
	<-busy // the waiter was answered in progress at least once
	release()
	require.NoError(t, <-done)
	out := <-waited
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Positive(t, out.Waited)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
}

// A first phase that fails (its error, not a crash) leaves its key as a
// separate acquisition would: released, with the error, for the client's
// retry, the completer and `idem keys list`. Its writes rolled back.
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
	require.Equal(t, idem.StatusRunning, rec.Status)
	require.Equal(t, idem.RecoveryPointStarted, rec.RecoveryPoint)
	require.Nil(t, rec.LockedAt, "released")
	require.Contains(t, rec.LastError, "the fraud check is down")
	require.Zero(t, b.countRows(t, "rides"))

	failing = false
	out, err := b.runner(t, nil).Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, rec.ID, out.Record.ID, "the recorded key, resumed")
	require.Equal(t, 1, b.countRows(t, "rides"))
}

// A worker that stalls in the first phase of a new key holds an
// uncommitted key, which no lease guards and nobody can take over. The
// server ends its transaction once it has sat idle for the lease, and the key
// goes with it: a retry makes the key anew and finishes, and the stalled
// worker, resumed, commits nothing.
func TestStalledFirstPhaseEndsWithItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	entered, release := pauseIn(t, b, "ride_created")
	cfg := &idem.Config{Lease: time.Second, HeartbeatInterval: 300 * time.Millisecond, Test: idem.TestConfig{Now: time.Now}}
	req := b.request("k1", rideInput{Origin: "SF", Amount: 20})
	type result struct {
		out *idem.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := b.runner(t, cfg).Execute(ctx, b.flow, req)
		done <- result{out, err}
	}()
	<-entered

	// Retry, as a client would, until the server has ended the idle
	// transaction: until then the key is busy, and never there.
	deadline := time.Now().Add(2 * time.Minute)
	var out *idem.Outcome
	for {
		var err error
		out, err = b.runner(t, cfg).Execute(ctx, b.flow, req)
		if !errors.Is(err, idemdriver.ErrKeyBusy) {
			require.NoError(t, err)
			break
		}
		require.True(t, time.Now().Before(deadline), "the server never ended the stalled transaction")
		time.Sleep(50 * time.Millisecond) // a client's pause between retries, with a deadline
	}
	require.Equal(t, idem.OutcomeExecuted, out.Kind)

	release()
	stalled := <-done
	require.Error(t, stalled.err, "the stalled worker's transaction was ended: it commits nothing")
	require.NotEqual(t, idem.OutcomeExecuted, stalled.out.Kind)
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())
	require.Equal(t, idem.StatusFinished, b.key(t, "k1").Status)
}
