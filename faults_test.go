package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

// A phase cannot end its own transaction: the Tx it gets has no Commit or
// Rollback, and the pgx.Tx view for libraries that need one refuses both. On
// main a phase could call Commit, its writes committed without the recovery
// point, and the retry wrote them again.
func TestPhaseCannotEndItsTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	runs := 0
	flow := idem.MustNewFlow("commit.bypass", []idem.Phase[rideInput]{{
		Name: "write",
		Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO jobs (ride_id, kind) VALUES (0, 'side-write')`); err != nil {
				return idem.Result{}, err
			}
			if _, ok := tx.(interface{ Commit(context.Context) error }); ok {
				return idem.Result{}, errors.New("the phase's Tx can be committed")
			}
			if _, ok := tx.(interface{ Rollback(context.Context) error }); ok {
				return idem.Result{}, errors.New("the phase's Tx can be rolled back")
			}
			for _, control := range []string{"COMMIT", "rollback", "  /* quietly */ END", "-- a comment\nBEGIN"} {
				if _, err := tx.Exec(ctx, control); !errors.Is(err, pgstore.ErrPhaseEndedTx) {
					return idem.Result{}, fmt.Errorf("%q through the phase's Tx: %v", control, err)
				}
			}
			view := a.PgxTx()
			if _, ok := view.(interface{ RollbackPhase(context.Context) error }); ok {
				return idem.Result{}, errors.New("the pgx.Tx view exposes the store's RollbackPhase")
			}
			if err := view.Commit(ctx); !errors.Is(err, idem.ErrPhaseOwnsTx) {
				return idem.Result{}, errors.New("the pgx.Tx view committed")
			}
			if err := view.Rollback(ctx); !errors.Is(err, idem.ErrPhaseOwnsTx) {
				return idem.Result{}, errors.New("the pgx.Tx view rolled back")
			}
			if runs++; runs == 1 {
				return idem.Result{}, errors.New("fail the first run after the write")
			}
			return idem.RespondJSON(http.StatusCreated, map[string]any{"ok": true}), nil
		},
	}}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	_, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "SF"}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.Zero(t, b.countRows(t, "jobs"), "a failed phase's writes roll back, whatever it tried")
	out, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "SF"}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.countRows(t, "jobs WHERE kind = 'side-write'"))
}

// A *pgconn.PgError without a SQLSTATE (as mocks and wrappers build them)
// is a phase failure, not a panic of the runner: main indexed Code[:2].
func TestPgErrorWithoutCodeIsAPhaseFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, nil)
	b.hooks["ride_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		return &pgconn.PgError{Message: "synthetic"}
	}
	var out *idem.Outcome
	var err error
	require.NotPanics(t, func() {
		out, err = r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	})
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
}

// With the server's default isolation at repeatable read, a concurrent
// insert of the same key is a serialization failure in the acquisition
// statement; losers must still read as in progress or replayed, never
// failed (main answered them OutcomeFailed).
func TestConcurrentAcquireUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store := storeOn(t, b.schema, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	})
	r, err := idem.NewRunner(store, &idem.Config{Test: idem.TestConfig{Now: b.clock.Now}})
	require.NoError(t, err)

	const n = 32
	kinds := make([]idem.OutcomeKind, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			out, err := r.Execute(context.Background(), b.flow, b.request("storm", rideInput{Origin: "SF", Amount: 20}))
			kinds[i], errs[i] = out.Kind, err
		})
	}
	close(start)
	wg.Wait()
	executed := 0
	for i, k := range kinds {
		switch k {
		case idem.OutcomeExecuted:
			executed++
		case idem.OutcomeInProgress, idem.OutcomeReplayed:
		default:
			t.Fatalf("request %d: %s: %v", i, k, errs[i])
		}
	}
	require.Equal(t, 1, executed)
	require.Equal(t, 1, b.countRows(t, "rides"))
}

// A final phase whose commit fails and is retried keeps its lease alive:
// on main the heartbeat stopped when the final commit was sent and never
// started again, so a slow retry lost its lease to the next request.
//
// The first commit of the final phase meets a real serialization failure
// (a trigger raises 40001 once); the retry then waits inside the phase until
// it has seen a heartbeat renew the lease, which only a live heartbeat can
// give it.
func TestRetriedFinalPhaseKeepsItsHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `
		CREATE SEQUENCE finish_tries; -- not transactional: the failed try still counts
		CREATE FUNCTION fail_finish_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.status = 'finished' AND nextval('finish_tries') = 1 THEN
				RAISE EXCEPTION 'a serialization failure at commit' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_finish_once BEFORE UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION fail_finish_once()`)
	require.NoError(t, err)

	beats := make(chan struct{}, 64)
	var attempts []int
	flow := idem.MustNewFlow("final.retry", []idem.Phase[rideInput]{{
		Name: "final",
		Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
			attempts = append(attempts, a.Number())
			if a.Number() == 2 {
				// Drain beats from before the failed commit, then wait for
				// a fresh one: the heartbeat must still be running.
				for len(beats) > 0 {
					<-beats
				}
				select {
				case <-beats:
				case <-time.After(30 * time.Second):
					return idem.Result{}, errors.New("no heartbeat while the retried final phase ran")
				}
			}
			return idem.RespondJSON(http.StatusCreated, map[string]any{"ok": true}), nil
		},
	}}, nil)
	r := b.runner(t, &idem.Config{
		Flows: []idem.AnyFlow{flow}, Lease: 3 * time.Second, HeartbeatInterval: 50 * time.Millisecond,
		Test: idem.TestConfig{Now: time.Now},
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventHeartbeat {
				select {
				case beats <- struct{}{}:
				default:
				}
			}
		}),
	})
	out, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "SF"}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, []int{1, 2}, attempts)
}

// A lost acknowledgement of the final commit: the key finished, so the
// runner must report the response, not OutcomeLockLost (main released the
// key, which a finished key refuses, and reported the lock lost).
func TestLostAckOfFinalCommitReportsTheResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterCommit && at.Phase == "receipt_enqueued" {
			return errors.New("connection reset while reading the COMMIT reply")
		}
		return nil
	})})
	out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.Equal(t, idemtype.StoredFinished, b.key(t, "k1").Status)
}

// The first answer is exactly what every replay gets: headers that are never
// stored are not handed to the first caller either (main gave the first
// caller Set-Cookie and stored a filtered copy).
func TestFirstAnswerIsTheStoredAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := idem.MustNewFlow("cookie", []idem.Phase[rideInput]{{
		Name: "respond",
		Do: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
			return idem.Respond(http.StatusCreated, http.Header{
				"Set-Cookie": {"session=1"}, "Authorization": {"Bearer x"}, "Location": {"/rides/1"},
			}, []byte(`{}`)), nil
		},
	}}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	first, err := r.Execute(context.Background(), flow, b.request("k1", rideInput{Origin: "SF"}))
	require.NoError(t, err)
	replay, err := r.Execute(context.Background(), flow, b.request("k1", rideInput{Origin: "SF"}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, replay.Kind)
	require.Equal(t, replay.Response, first.Response)
	require.Equal(t, http.Header{"Location": {"/rides/1"}}, first.Response.Header)
}

// Self-fencing: a worker paused between its foreign mark and its call for
// longer than its lease does not make the call (another worker may own the
// key by then); the key goes to reconcile, which finds nothing was sent, and
// the message goes out exactly once.
func TestWorkerPausedPastItsLeaseDoesNotMakeItsCall(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	var clock = b.clock
	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Test: idemtest.WithHook(idem.TestConfig{Now: clock.Now}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookBeforeForeign && at.Key.Attempts == 1 {
			clock.Advance(2 * idem.LeaseDefault) // a long GC pause
		}
		return nil
	})})
	out, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrLockLost)
	require.Equal(t, idem.OutcomeLockLost, out.Kind)
	require.Zero(t, b.gateway.times(b.ref(t, "k1")), "the paused worker made no call")

	out, err = r.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile, "the mark says a call may have happened")
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	out, err = r.Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "k1")))
}

// Marks and heartbeats never wait on the phases' pool: with a pool of two
// connections and fifty requests inside a not-idempotent phase at once, every
// request finishes (on main, as many requests as connections deadlocked).
func TestMarksDoNotWaitOnThePhasePool(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	store := storeOn(t, b.schema, func(cfg *pgxpool.Config) { cfg.MaxConns = 2 })
	// Statements wait their turn for one of two connections: the timeout is
	// generous so that a loaded machine's queue is not read as a deadlock.
	r, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{b.flow}, StatementTimeout: time.Minute,
		Test: idem.TestConfig{Now: b.clock.Now}})
	require.NoError(t, err)

	const n = 50
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			_, errs[i] = r.Execute(ctx, b.flow, b.req("k"+strconv.Itoa(i)))
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "request %d", i)
	}
	require.Equal(t, n, b.countRows(t, "messages WHERE sent"))
}

// A phase that ends its transaction behind the runner's back, through the
// raw connection of its pgx.Tx view, fails: the guarded commit refuses to run
// outside a transaction, rather than record the recovery point alone.
func TestPhaseThatCommitsThroughItsConnectionFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := idem.MustNewFlow("commit.sneaky", []idem.Phase[rideInput]{{
		Name: "write",
		Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO jobs (ride_id, kind) VALUES (0, 'sneaky')`); err != nil {
				return idem.Result{}, err
			}
			_, err := a.PgxTx().Conn().Exec(ctx, "COMMIT")
			return idem.RespondJSON(http.StatusCreated, map[string]any{"ok": true}), err
		},
	}}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	out, err := r.Execute(context.Background(), flow, b.request("k1", rideInput{Origin: "SF"}))
	require.ErrorIs(t, err, pgstore.ErrPhaseEndedTx)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	require.Equal(t, idemtype.RecoveryPointStarted, b.key(t, "k1").RecoveryPoint, "no recovery point without the phase's transaction")
}

// Input the database refuses in a later phase is a phase failure, not "bad
// input, nothing written": an earlier phase committed, and the retry resumes.
func TestUnstorableInputInALaterPhaseIsAPhaseFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, nil)
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		_, err := tx.Exec(ctx, `INSERT INTO jobs (ride_id, kind) VALUES (1, convert_from('\x6100'::bytea, 'UTF8'))`)
		return err
	}
	out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	require.Equal(t, "ride_created", b.key(t, "k1").RecoveryPoint)
}
