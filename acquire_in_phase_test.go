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

// executed is how an Execute ended.
type executed struct {
	out *idem.Outcome
	err error
}

// startPausedIn executes req on a runner made with cfg, its phase pausing
// on its first run until release is called, and returns once it paused;
// done gets how the request ended.
func startPausedIn(t *testing.T, b *testBundle, phase string, cfg *idem.Config, req idem.Request) (done <-chan executed, release func()) {
	t.Helper()
	entered, out := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(out) })
	t.Cleanup(release) // a failing test must not leave the worker holding a connection
	var first atomic.Bool
	b.hooks[phase] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-out
		}
		return nil
	}
	ended := make(chan executed, 1)
	r := b.runner(t, cfg)
	go func() {
		o, err := r.Execute(context.Background(), b.flow, req)
		ended <- executed{o, err}
	}()
	select {
	case <-entered:
	case e := <-ended:
		t.Fatalf("the first request ended before pausing in %s: %v", phase, e.err)
	}
	return ended, release
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
	req := b.request("k1", rideInput{Origin: "SF", Amount: 20})
	done, release := startPausedIn(t, b, "ride_created", nil, req)

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
	require.NoError(t, (<-done).err)
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
	req := b.request("k1", rideInput{Origin: "SF", Amount: 20})
	done, release := startPausedIn(t, b, "ride_created", nil, req)

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
	require.NoError(t, (<-done).err)
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
	cfg := &idem.Config{Lease: time.Second, HeartbeatInterval: 300 * time.Millisecond, Test: idem.TestConfig{Now: time.Now}}
	req := b.request("k1", rideInput{Origin: "SF", Amount: 20})
	done, release := startPausedIn(t, b, "ride_created", cfg, req)

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

// A first phase that makes a foreign call cannot run in the transaction of
// an uncommitted key: a crash after the call would leave its effect with no
// key to finish it, or to bind the request to its payload. The call is
// refused before it is made, the request starts over with its key
// committed first, and the flow acquires separately from then on.
func TestForeignCallInTheFirstPhaseCommitsTheKeyFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	flow := idem.MustNewFlow("charge.first", []idem.Phase[rideInput]{{
		Name: "charged",
		Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
			b.counts.Add("charged")
			var chargeID string
			if err := run.Foreign(ctx, "charge", func(ctx context.Context, key string) (err error) {
				chargeID, err = b.provider.Charge(key, run.Input().Amount)
				return err
			}); err != nil {
				return idem.Result{}, err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO rides (key_id, origin, charge_id) VALUES ($1, $2, $3)`, run.Key().ID, run.Input().Origin, chargeID); err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(201, map[string]string{"charge": chargeID}), nil
		},
	}}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	require.Equal(t, []string{"charged"}, r.AcquisitionJoins(flow), "nothing says yet that the phase makes a foreign call")
	out, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.provider.Charges())
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, map[string]int{"charged": 2}, b.counts.Get(), "the refused try, then the one with the key committed")
	require.Nil(t, r.AcquisitionJoins(flow), "the flow acquires separately from now on")

	// A crash right after the call now leaves the key, bound to its
	// payload: another body is a mismatch, and the same one finishes with
	// the same downstream key.
	crash := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}, Test: idem.TestConfig{Hook: crashAt(idem.HookAfterForeign, "charged")}})
	_, err = crash.Execute(ctx, flow, b.request("k2", rideInput{Origin: "SF", Amount: 7}))
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	b.clock.Advance(2 * time.Hour)
	_, err = r.Execute(ctx, flow, b.request("k2", rideInput{Origin: "LA", Amount: 9}))
	require.ErrorIs(t, err, idem.ErrMismatch)
	out, err = r.Execute(ctx, flow, b.request("k2", rideInput{Origin: "SF", Amount: 7}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 2, b.provider.Charges(), "the provider saw k2's downstream key twice and charged once")
}

// A key that replaces an expired one is one generation on, and its
// downstream keys derive from that generation: it is committed before the
// first phase runs, so that a first phase that does not commit cannot bring
// the expired key back (for the reaper to delete, and a retry to replace at
// generation 0, with other downstream keys).
func TestReplacingAnExpiredKeyCommitsItsGenerationFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	req := b.request("k1", rideInput{Origin: "SF", Amount: 5})
	_, err := b.runner(t, &idem.Config{Retention: time.Hour}).Execute(ctx, b.flow, req)
	require.NoError(t, err)
	b.clock.Advance(2 * time.Hour)

	crash := b.runner(t, &idem.Config{Test: idem.TestConfig{Hook: crashAt(idem.HookBeforeCommit, "ride_created")}})
	_, err = crash.Execute(ctx, b.flow, req)
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	rec := b.key(t, "k1")
	require.Equal(t, 1, rec.Generation, "the replacement is committed")
	require.Equal(t, idem.StatusRunning, rec.Status)
	require.Equal(t, idem.RecoveryPointStarted, rec.RecoveryPoint)
}

// A first phase that runs for longer than the lease renews it with its
// commit: a key acquired in the phase's transaction had no heartbeat, and
// must not commit a lease that already ran out, for a duplicate to take the
// live worker's key over.
func TestLongFirstPhaseRenewsTheLeaseItCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.hooks["ride_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		b.clock.Advance(2 * time.Minute) // longer than the 90 s lease
		return nil
	}
	req := b.request("k1", rideInput{Origin: "SF", Amount: 5})
	done, release := startPausedIn(t, b, "charge_created", nil, req)
	rec := b.key(t, "k1")
	require.True(t, rec.LeaseExpiresAt.After(b.clock.Now()), "lease %v, now %v", rec.LeaseExpiresAt, b.clock.Now())
	out, err := b.runner(t, nil).Execute(ctx, b.flow, req)
	require.ErrorIs(t, err, idem.ErrInProgress, "the live worker keeps its key")
	require.Equal(t, idem.OutcomeInProgress, out.Kind)
	release()
	require.NoError(t, (<-done).err)
}
