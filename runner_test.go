package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

// Semantics 1: a new key runs every phase once, in order; the response is
// stored.
func TestNewKeyRunsEveryPhaseOnceInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var order []string
	for _, p := range b.flow.PhaseNames() {
		b.hooks[p] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
			order = append(order, run.Phase())
			return nil
		}
	}
	out, err := b.runner(t, nil).Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, []string{"ride_created", "charge_created", "receipt_enqueued"}, order)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
	require.Equal(t, http.StatusCreated, out.Response.Status)

	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, idemtype.RecoveryPointFinished, rec.RecoveryPoint)
	require.Equal(t, http.StatusCreated, rec.ResponseStatus)
	require.Equal(t, out.Response.Body, rec.ResponseBody)
	require.Nil(t, rec.LockedAt)
	require.NotNil(t, rec.ExpiresAt)
	require.Equal(t, b.clock.Now().Add(24*time.Hour), rec.ExpiresAt.UTC())
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.countRows(t, "jobs"))
	require.Equal(t, 1, b.provider.Charges())
}

// Semantics 2: a retry of a finished key returns the stored status, headers
// and body byte for byte, marked as a replay, and runs no phase.
func TestReplayReturnsStoredResponseByteForByte(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	before := b.counts.Get()

	// A different runner (another process) replays it too.
	again, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, again.Kind)
	require.Equal(t, before, b.counts.Get(), "a replay must not run any phase")
	require.Equal(t, first.Response.Status, again.Response.Status)
	require.Equal(t, first.Response.Body, again.Response.Body, "body must be byte-identical, odd spacing included")
	require.Contains(t, string(again.Response.Body), `,  "charge_id"`)
	require.Equal(t, "application/json", again.Response.Header.Get("Content-Type"))
	require.Equal(t, first.Response.Header.Get("X-Ride"), again.Response.Header.Get("X-Ride"))
	require.Empty(t, again.Response.Header.Values("Set-Cookie"), "Set-Cookie is never stored")
}

// Semantics 3: 64 goroutines send the same key and payload at once; every
// phase body runs exactly once; every other caller gets in-progress or the
// replay; no unique violation and no failure reaches a caller.
func TestConcurrentSameKeyRunsEachPhaseOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, nil)
	const callers = 64
	start := make(chan struct{})
	type result struct {
		out *idem.Outcome
		err error
	}
	results := make(chan result, callers)
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out, err := r.Execute(context.Background(), b.flow, b.request("storm", rideInput{Origin: "SF", Amount: 20}))
			results <- result{out, err}
		}()
	}
	close(start)
	wg.Wait()
	close(results)

	kinds := map[idem.OutcomeKind]int{}
	for res := range results {
		kinds[res.out.Kind]++
		switch res.out.Kind {
		case idem.OutcomeExecuted, idem.OutcomeReplayed:
			require.NoError(t, res.err)
			require.Equal(t, http.StatusCreated, res.out.Response.Status)
		case idem.OutcomeInProgress:
			require.ErrorIs(t, res.err, idem.ErrInProgress)
			require.GreaterOrEqual(t, res.out.RetryAfter, time.Second)
		default:
			t.Fatalf("unexpected outcome %s: %v", res.out.Kind, res.err)
		}
	}
	require.Equal(t, 1, kinds[idem.OutcomeExecuted], "outcomes: %v", kinds)
	require.Equal(t, callers, kinds[idem.OutcomeExecuted]+kinds[idem.OutcomeReplayed]+kinds[idem.OutcomeInProgress])
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())
}

// Semantics 4: the same key with a different payload or a different flow is
// a mismatch, checked before the lock: even while the first request holds a
// live lease, the second learns "mismatch", not "in progress".
func TestMismatchIsCheckedBeforeTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	other := b.rideFlow("rides.other")

	// Hold the key: the first request pauses inside its first phase.
	done, letGo := startPausedIn(t, b, "ride_created", nil, b.request("k1", rideInput{Origin: "SF", Amount: 20}))

	for name, tc := range map[string]struct {
		flow idem.AnyFlow
		in   rideInput
	}{
		"different payload": {b.flow, rideInput{Origin: "LA", Amount: 20}},
		"different flow":    {other, rideInput{Origin: "SF", Amount: 20}},
	} {
		out, err := r.Execute(ctx, tc.flow, b.request("k1", tc.in))
		require.ErrorIs(t, err, idem.ErrMismatch, name)
		require.Equal(t, idem.OutcomeMismatch, out.Kind, name)
	}
	// The same request, by contrast, is in progress.
	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, out.Kind)

	letGo()
	require.NoError(t, (<-done).err)
	// And after it finished, the mismatch still wins over the replay.
	_, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "LA", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrMismatch)
	require.Equal(t, 1, b.counts.Get()["ride_created"])
}

// Semantics 5: a Go error in phase k rolls back phase k only; the retry
// resumes at phase k and never re-runs the phases before it.
func TestPhaseErrorRollsBackThatPhaseAndRetryResumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	boom := errors.New("receipt service hiccup")
	fail := true
	b.hooks["receipt_enqueued"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		// A write that must vanish with the rollback.
		if _, err := tx.Exec(ctx, `INSERT INTO jobs (ride_id, kind) VALUES (0, 'leaked')`); err != nil {
			return err
		}
		if fail {
			return boom
		}
		return nil
	}
	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.ErrorIs(t, err, boom)
	require.Equal(t, idem.OutcomeFailed, out.Kind)

	rec := b.key(t, "k1")
	require.Equal(t, "charge_created", rec.RecoveryPoint, "the two committed phases stay committed")
	require.Nil(t, rec.LockedAt, "a Go error releases the lock")
	require.Contains(t, rec.LastError, "receipt service hiccup")
	require.Equal(t, 0, b.countRows(t, "jobs"), "phase k's writes rolled back")
	require.Equal(t, 1, b.countRows(t, "rides"))

	fail = false
	out, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 2}, b.counts.Get())
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())
	require.Equal(t, 2, b.key(t, "k1").Attempts)
}

// A panic in a phase is a phase failure: rolled back, released, retryable.
func TestPanicInPhaseReleasesAndRetryResumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	panicking := true
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		if panicking {
			panic("nil map somewhere")
		}
		return nil
	}
	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	var pe *idem.PanicError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.Equal(t, "nil map somewhere", pe.Value)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	rec := b.key(t, "k1")
	require.Nil(t, rec.LockedAt)
	require.Equal(t, "ride_created", rec.RecoveryPoint)

	panicking = false
	out, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.counts.Get()["ride_created"])
}

// Semantics 6: a crash (the worker stops without releasing anything) leaves
// the key locked; a retry inside the lease gets in-progress; after the lease
// it takes over and resumes at the right phase.
func TestCrashLeavesKeyLockedUntilLeaseExpires(t *testing.T) {
	t.Parallel()
	crashLeavesKeyLockedUntilLeaseExpires(t, setup(t))
}

func crashLeavesKeyLockedUntilLeaseExpires(t *testing.T, b *testBundle) {
	ctx := context.Background()
	crashing := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterCommit && at.Phase == "charge_created" {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	out, err := crashing.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)

	rec := b.key(t, "k1")
	require.Equal(t, "charge_created", rec.RecoveryPoint)
	require.NotNil(t, rec.LockedAt, "a crash releases nothing")
	require.Equal(t, b.clock.Now().Add(90*time.Second), rec.LeaseExpiresAt.UTC())

	healthy := b.runner(t, nil)
	b.clock.Advance(89 * time.Second)
	out, err = healthy.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, out.Kind)
	require.Equal(t, time.Second, out.RetryAfter)

	b.clock.Advance(2 * time.Second)
	out, err = healthy.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
	require.Equal(t, int64(2), b.key(t, "k1").Fence)
}

// takeOverAPausedWorker runs key k1 on a worker that makes write in its
// first phase ride_created and pauses there, before committing; lets its
// lease run out while another worker takes the key over and finishes it
// (executed, a takeover); then resumes it, and returns how it ended.
func takeOverAPausedWorker(t *testing.T, b *testBundle, write func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error) (*idem.Outcome, error) {
	t.Helper()
	ctx := context.Background()
	pause := testfixture.NewPause(t)
	var first atomic.Bool
	first.Store(true)
	b.hooks["ride_created"] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		if !first.CompareAndSwap(true, false) {
			return nil
		}
		if err := write(ctx, tx, run); err != nil {
			return err
		}
		pause.Hold(context.Background())
		return nil
	}
	type result struct {
		out *idem.Outcome
		err error
	}
	stale := b.runner(t, nil)
	staleDone := make(chan result, 1)
	go func() {
		out, err := stale.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
		staleDone <- result{out, err}
	}()
	select {
	case <-pause.Reached():
	case r := <-staleDone:
		t.Fatalf("the first worker ended before pausing in its phase: %v", r.err)
	}

	// The stale worker's lease runs out; another takes over and finishes.
	b.clock.Advance(91 * time.Second)
	out, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)

	pause.Release()
	r := <-staleDone
	return r.out, r.err
}

// Semantics 7: fencing. A worker whose lease was taken over cannot commit
// its phase; its local writes roll back.
func TestFencingStopsATakenOverWorker(t *testing.T) {
	t.Parallel()
	fencingStopsATakenOverWorker(t, setup(t))
}

func fencingStopsATakenOverWorker(t *testing.T, b *testBundle) {
	// The worker pauses in the first phase: its key committed, and leased,
	// before that phase, for another worker to take it over.
	staleOut, err := takeOverAPausedWorker(t, b, func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		if b.scoped { // Citus: jobs is distributed by the key's scope
			_, err := tx.Exec(ctx, `INSERT INTO jobs (scope, ride_id, kind) VALUES ($1, 0, 'stale-worker-write')`, run.Key().Scope)
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO jobs (ride_id, kind) VALUES (0, 'stale-worker-write')`)
		return err
	})
	require.ErrorIs(t, err, idem.ErrLockLost)
	require.Equal(t, idem.OutcomeLockLost, staleOut.Kind)
	require.Equal(t, 0, b.countRows(t, "jobs WHERE kind = 'stale-worker-write'"), "the stale worker's writes rolled back")
	require.Equal(t, 1, b.countRows(t, "rides"), "only the new owner's ride exists")
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, int64(2), rec.Fence)
}

// Semantics 8: a slow but live phase keeps its lease (heartbeat) and is not
// taken over, though it outlives the original lease.
func TestHeartbeatKeepsASlowPhaseLease(t *testing.T) {
	t.Parallel()
	heartbeatKeepsASlowPhaseLease(t, setup(t))
}

func heartbeatKeepsASlowPhaseLease(t *testing.T, b *testBundle) {
	ctx := context.Background()
	beats := make(chan struct{}, 16)
	slow := b.runner(t, &idem.Config{
		HeartbeatInterval: 5 * time.Millisecond,
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventHeartbeat {
				select {
				case beats <- struct{}{}:
				default:
				}
			}
		}),
	})
	pause := testfixture.NewPause(t)
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		pause.Hold(context.Background())
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := slow.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
		done <- err
	}()
	select {
	case <-pause.Reached():
	case err := <-done:
		t.Fatalf("the slow worker ended before reaching its slow phase: %v", err)
	}

	other := b.runner(t, nil)
	// Walk the clock well past the original 90s lease, one heartbeat at a
	// time: each beat renews the lease from the (fake) now.
	for i := 0; i < 4; i++ {
		b.clock.Advance(60 * time.Second)
		// Wait for a beat that renewed the lease from the new now; a beat
		// already in flight may have read the clock before the advance.
		renewed := false
		for beat := 0; beat < 500 && !renewed; beat++ {
			<-beats
			renewed = b.key(t, "k1").LeaseExpiresAt.After(b.clock.Now().Add(60 * time.Second))
		}
		require.True(t, renewed, "500 heartbeats and the lease was never renewed from the new now")
		out, err := other.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
		require.ErrorIs(t, err, idem.ErrInProgress, "round %d", i)
		require.Equal(t, idem.OutcomeInProgress, out.Kind)
	}
	pause.Release()
	require.NoError(t, <-done)
	require.Equal(t, int64(1), b.key(t, "k1").Fence, "never taken over")
	require.Equal(t, 1, b.counts.Get()["charge_created"])
}

// Semantics 9: a serialization failure or a deadlock inside a phase is
// retried automatically, a bounded number of times, then surfaces as a
// retryable error. The failures here are real ones from Postgres.
func TestSerializationFailuresAndDeadlocksAreRetried(t *testing.T) {
	t.Parallel()

	t.Run("serialization failure, then success", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		conflicts := 2
		r := b.runner(t, &idem.Config{Isolation: pgx.RepeatableRead})
		b.hooks["ride_created"] = b.conflictOnce(t, &conflicts)
		out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out.Kind)
		require.Equal(t, 3, b.counts.Get()["ride_created"], "two failed attempts and a good one")
		require.Equal(t, 1, b.countRows(t, "rides"))
	})

	t.Run("deadlock, then success", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		deadlocks := 1
		r := b.runner(t, nil)
		b.hooks["ride_created"] = b.deadlockOnce(t, &deadlocks)
		out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out.Kind)
		require.Equal(t, 2, b.counts.Get()["ride_created"])
	})

	t.Run("exhausted, released, retry later succeeds", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		conflicts := 100
		var retried int
		r := b.runner(t, &idem.Config{Isolation: pgx.RepeatableRead, MaxPhaseRetries: 2,
			Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
				if e.Kind == idem.EventPhaseRetried {
					retried++
				}
			})})
		b.hooks["ride_created"] = b.conflictOnce(t, &conflicts)
		out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
		require.ErrorIs(t, err, idem.ErrRetriesExhausted)
		require.ErrorIs(t, err, idem.ErrSerialization)
		require.Equal(t, idem.OutcomeFailed, out.Kind)
		require.Equal(t, 3, b.counts.Get()["ride_created"], "one try and two retries")
		require.Equal(t, 2, retried)
		rec := b.key(t, "k1")
		require.Nil(t, rec.LockedAt, "released for a later retry")
		require.Equal(t, idemtype.RecoveryPointStarted, rec.RecoveryPoint)

		conflicts = 0
		out, err = r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out.Kind)
	})
}

// conflictOnce makes the phase's transaction fail with a real serialization
// failure while *remaining > 0: it reads a row in its snapshot, another
// transaction updates and commits that row, then the phase updates it.
func (b *testBundle) conflictOnce(t *testing.T, remaining *int) func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS counters (id int PRIMARY KEY, n int); INSERT INTO counters VALUES (1, 0) ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	return func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		var n int
		if err := tx.QueryRow(ctx, `SELECT n FROM counters WHERE id = 1`).Scan(&n); err != nil {
			return err
		}
		if *remaining > 0 {
			*remaining--
			if _, err := b.pool.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE id = 1`); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `UPDATE counters SET n = $1 WHERE id = 1`, n+1)
		return err
	}
}

// deadlockOnce makes the phase's transaction the victim of a real deadlock
// while *remaining > 0: the phase locks row 1, an outside transaction locks
// row 2 and waits for row 1, the phase then asks for row 2. The phase's
// short deadlock_timeout makes it the one the detector aborts.
func (b *testBundle) deadlockOnce(t *testing.T, remaining *int) func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS locks (id int PRIMARY KEY); INSERT INTO locks VALUES (1), (2) ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	return func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		if *remaining == 0 {
			return nil
		}
		*remaining--
		if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '20ms'; SELECT 1 FROM locks WHERE id = 1 FOR UPDATE`); err != nil {
			return err
		}
		other, err := b.pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := other.Exec(ctx, `SET LOCAL deadlock_timeout = '10s'; SELECT 1 FROM locks WHERE id = 2 FOR UPDATE`); err != nil {
			_ = other.Rollback(context.WithoutCancel(ctx))
			return err
		}
		otherDone := make(chan error, 1)
		go func() {
			_, err := other.Exec(ctx, `SELECT 1 FROM locks WHERE id = 1 FOR UPDATE`)
			if err == nil {
				err = other.Commit(ctx)
			}
			if err != nil {
				// The phase's context ended first (it is cancelled when
				// the phase does): end the transaction all the same, or
				// its connection is never returned and the pool's Close
				// waits for it forever.
				_ = other.Rollback(context.WithoutCancel(ctx))
			}
			otherDone <- err
		}()
		// Wait until the outside transaction is really waiting on row 1.
		require.Eventually(t, func() bool {
			var waiting bool
			_ = b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%locks WHERE id = 1%')`).Scan(&waiting)
			return waiting
		}, 10*time.Second, 2*time.Millisecond)
		_, err = tx.Exec(ctx, `SELECT 1 FROM locks WHERE id = 2 FOR UPDATE`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			return fmt.Errorf("expected a deadlock, got %v", err)
		}
		// Let the runner roll back; the outside transaction then wins.
		go func() { <-otherDone }()
		return err
	}
}

// Semantics 10: checkpoint data written by phase k is read by phase k+1
// after a crash, in a new runner.
func TestCheckpointSurvivesACrashIntoANewRunner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	crashing := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookPhaseStart && at.Phase == "charge_created" {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	_, err := crashing.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	var rideID int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id FROM rides`).Scan(&rideID))

	var seen int64
	b.hooks["charge_created"] = func(_ context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) error {
		ok, err := run.Checkpoint("ride_id", &seen)
		require.True(t, ok)
		return err
	}
	b.clock.Advance(2 * time.Minute)
	out, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, rideID, seen)
	require.Equal(t, rideID, int64(decodeBody(t, out.Response.Body)["ride_id"].(float64)))
}

// Semantics 11: a phase that responds with a 4xx (a decline) is stored and
// replayed like a success.
func TestDeclineIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	b.provider.Decline(99)
	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 99}))
	require.NoError(t, err, "a decline is an executed outcome, not an error")
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, http.StatusPaymentRequired, out.Response.Status)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, http.StatusPaymentRequired, rec.ResponseStatus)

	again, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 99}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, again.Kind)
	require.Equal(t, out.Response.Body, again.Response.Body)
	require.Equal(t, 1, b.counts.Get()["charge_created"])
	require.Equal(t, 0, b.counts.Get()["receipt_enqueued"])
}

// Semantics 12: the same key in two scopes runs twice, independently;
// neither sees the other's response.
func TestSameKeyInTwoScopesIsTwoRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	alice := idem.Request{Scope: "user:alice", Key: "shared", Params: rideInput{Origin: "SF", Amount: 20}}
	bob := idem.Request{Scope: "user:bob", Key: "shared", Params: rideInput{Origin: "NYC", Amount: 30}}
	a, err := r.Execute(ctx, b.flow, alice)
	require.NoError(t, err)
	bo, err := r.Execute(ctx, b.flow, bob)
	require.NoError(t, err, "a different scope is not a mismatch")
	require.Equal(t, idem.OutcomeExecuted, a.Kind)
	require.Equal(t, idem.OutcomeExecuted, bo.Kind)
	require.NotEqual(t, a.Response.Body, bo.Response.Body)

	a2, err := r.Execute(ctx, b.flow, alice)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, a2.Kind)
	require.Equal(t, a.Response.Body, a2.Response.Body)
	require.Equal(t, 2, b.countRows(t, "rides"))
	require.Equal(t, 2, b.provider.Charges())
}

// Semantics 13: with the database unreachable the runner reports
// store-unavailable and runs no phase (fail closed).
func TestStoreUnavailableFailsClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A pool pointed at a port where nothing listens.
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgstore.New(pool, nil)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	r, err := idem.NewRunner(store, nil)
	require.NoError(t, err)

	out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Equal(t, idem.OutcomeStoreUnavailable, out.Kind)
	require.Empty(t, b.counts.Get(), "no phase may run when the store is unreachable")
	require.Equal(t, 0, b.provider.Charges())
}

// A store that goes away mid-flow: the phase cannot commit, the request
// fails as unavailable, and once the store is back a retry resumes.
func TestStoreLostMidFlowResumesLater(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		// Kill this phase's own backend, as a database failover would.
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		_, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid)
		return err
	}
	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Equal(t, idem.OutcomeStoreUnavailable, out.Kind)
	require.Equal(t, "ride_created", b.key(t, "k1").RecoveryPoint)

	delete(b.hooks, "charge_created")
	out, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.countRows(t, "rides"))
}

// A lost commit acknowledgement: the phase committed but the worker saw an
// error. It must not re-run the phase: it re-reads the key under its fence,
// finds the commit landed, and goes on.
func TestLostCommitAcknowledgementIsNotReRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterCommit && at.Phase == "ride_created" && at.Key.Attempts == 1 {
			return errors.New("connection reset while reading the COMMIT reply")
		}
		return nil
	})})
	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.counts.Get()["ride_created"])
	require.Equal(t, 1, b.countRows(t, "rides"))
}

// A foreign call that fails with a network error (the provider dropped the
// connection) is the phase's failure, not the key store's: the database is
// fine, and the client must not be told it is unavailable.
func TestProviderNetworkErrorIsAPhaseFailureNotAStoreOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, nil)
	dropped := &net.OpError{Op: "read", Net: "tcp", Err: io.ErrUnexpectedEOF}
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		return fmt.Errorf("charge: %w", dropped)
	}
	out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.False(t, errors.Is(err, idem.ErrStoreUnavailable), "got %v", err)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
}
