package idemtest_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

// The tests in this file feed the kit deliberately broken flows and show
// what it catches, and what it cannot.

// (a) Two foreign calls in one phase: the runner refuses the second, so the
// flow cannot even run once, and the kit says so before any scenario.
func TestCatchesTwoForeignCallsInOnePhase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := b.orderFlow("orders.create", func(ctx context.Context, run *idem.Attempt[orderInput]) (string, error) {
		id, err := b.chargeThroughWrapper(ctx, run)
		if err != nil {
			return "", err
		}
		err = run.Foreign(ctx, "send_receipt", func(context.Context, string) error { return nil })
		return id, err
	})
	rep, err := idemtest.ExploreContext(context.Background(), b.config(flow))
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.True(t, rep.Baseline.Failed())
	require.Empty(t, rep.Scenarios)
	msg := rep.Err().Error()
	require.Contains(t, msg, "the uninterrupted baseline run failed")
	require.Contains(t, msg, "second foreign call")
	require.Contains(t, msg, `"send_receipt" was not made`)
}

// (b) A charge made outside Attempt.Foreign, without the downstream key: every
// re-run of the phase charges again. The user's Check (one charge per key)
// catches it in exactly the scenarios that re-run the phase after the
// charge.
func TestCatchesADoubleChargeOutsideTheWrapperThroughCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := b.orderFlow("orders.create", func(ctx context.Context, run *idem.Attempt[orderInput]) (string, error) {
		e, err := b.provider.Do(ctx, "", run.Key().Key)
		return e.ID, err
	})
	rep, err := idemtest.ExploreContext(context.Background(), b.config(flow))
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.Equal(t, []string{"crash_before_commit@charged", "serialization_failure@charged", "lease_takeover@charged"}, failedNames(rep))
	// The kit never saw a foreign call, so it explored no crash after one.
	require.Empty(t, rep.ForeignPhases)
	require.Len(t, rep.Scenarios, 15)

	msg := rep.Err().Error()
	require.Contains(t, msg, "3 of 15 scenarios failed. The first:")
	require.Contains(t, msg, "scenario crash_before_commit@charged: the worker dies after phase \"charged\" did its work, right before its commit")
	require.Contains(t, msg, "1. worker 1 Execute; committed order_created; dies at before_commit of charged -> simulated_crash")
	require.Contains(t, msg, "2. clock +1m31s: the dead worker's lease runs out")
	require.Contains(t, msg, "3. worker 2 Execute; committed charged; committed responded -> executed 201 (took over)")
	require.Contains(t, msg, "Check: provider made 2 effects for")
	require.Contains(t, msg, "also failed: serialization_failure@charged, lease_takeover@charged")
}

// (b) again, with the provider handed to the kit: it flags the call without
// a downstream key on the very first run, without any Check.
func TestCatchesACallWithoutTheDownstreamKeyThroughProviders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := b.orderFlow("orders.create", func(ctx context.Context, run *idem.Attempt[orderInput]) (string, error) {
		e, err := b.provider.Do(ctx, "", run.Key().Key)
		return e.ID, err
	})
	cfg := b.config(flow)
	cfg.Check = nil
	cfg.Providers = []idemtest.FakeProvider{b.provider}
	rep, err := idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.True(t, rep.Baseline.Failed())
	require.Contains(t, rep.Err().Error(), "provider 0 received a call for")
	require.Contains(t, rep.Err().Error(), "with no idempotency key, which is no downstream key the runner handed out")
}

// (b) through the wrapper, but sending a fresh key instead of the one it is
// given: the hooks see the right key handed out, only the provider sees the
// wrong one sent. Check catches the double charge, now also after a crash
// right after the call.
func TestCatchesAWrapperCallThatIgnoresItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := b.orderFlow("orders.create", func(ctx context.Context, run *idem.Attempt[orderInput]) (string, error) {
		var chargeID string
		err := run.Foreign(ctx, "charge", func(ctx context.Context, _ string) error {
			e, err := b.provider.Do(ctx, rand.Text(), run.Key().Key)
			chargeID = e.ID
			return err
		})
		return chargeID, err
	})
	rep, err := idemtest.ExploreContext(context.Background(), b.config(flow))
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.Equal(t, []string{"crash_before_commit@charged", "crash_after_foreign@charged", "serialization_failure@charged", "lease_takeover@charged"}, failedNames(rep))
	require.Contains(t, rep.Err().Error(), "Check: provider made 2 effects for")
}

// (c) A phase that writes through the pool instead of its transaction: the
// write survives the phase's rollback and happens again on the re-run. The
// kit's bypass check (Config.Bypass) sees the row that outlived the
// rollback; a Check that counts the rows per key sees the duplicate in the
// scenarios that re-run the phase on the same key: the key commits before
// its first phase, so it keeps its id through the rollback.
func TestWritesOutsideTheTransactionAreCaught(t *testing.T) {
	t.Parallel()
	b := setup(t)
	auditedFlow := func(config *idem.FlowConfig[orderInput]) *idem.Flow[orderInput] {
		return idem.MustNewFlow("orders.audited", []idem.Phase[orderInput]{
			{
				Name: "order_created",
				Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
					if _, err := tx.Exec(ctx, `INSERT INTO orders (key_id, item) VALUES ($1, $2)`, run.Key().ID, run.Input().Item); err != nil {
						return idem.Result{}, err
					}
					// The bug: b.pool, not tx.
					_, err := b.pool.Exec(ctx, `INSERT INTO audit (key_id, what) VALUES ($1, 'order created')`, run.Key().ID)
					return idem.Advance(), err
				},
			},
			{
				Name: "responded",
				Do: func(context.Context, idem.Tx, *idem.Attempt[orderInput]) (idem.Result, error) {
					return idem.RespondJSON(http.StatusCreated, map[string]string{"status": "created"}), nil
				},
			},
		}, config)
	}
	oneAuditRow := func(ctx context.Context, key *idemtype.KeyRecord) error {
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM audit WHERE key_id = $1`, key.ID).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("%d audit rows for the key, want 1", n)
		}
		return nil
	}
	everyRollback := []string{"crash_before_commit@order_created", "serialization_failure@order_created", "lease_takeover@order_created"}
	bypassed := `phase "order_created" wrote 1 row(s) to ` + b.schema + `.audit through a connection other than its transaction`

	// The Check sees the duplicate wherever the phase re-runs.
	cfg := idemtest.Config[orderInput]{Pool: b.pool, Flow: auditedFlow(nil), Input: orderInput{Item: "book"}, Check: oneAuditRow}
	rep, err := idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.Equal(t, everyRollback, failedNames(rep))
	require.Contains(t, rep.Err().Error(), "Check: 2 audit rows for the key, want 1")

	// Without a Check, the bypass check alone catches it, in
	// crash_before_commit: after a serialization failure or a takeover the
	// phase re-runs on a key that kept its id, which only a Check counts.
	cfg.Check = nil
	rep, err = idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.Equal(t, []string{"crash_before_commit@order_created"}, failedNames(rep))
	require.Contains(t, rep.Err().Error(), bypassed)
	require.NotContains(t, rep.Err().Error(), ".orders", "the phase's own insert rolled back")

	// Ignoring the table, or turning the check off, and the kit cannot see
	// the duplicate rows.
	cfg.Bypass = idemtest.BypassCheck{Ignore: []string{"audit"}}
	rep, err = idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	require.NoError(t, rep.Err())
	cfg.Bypass = idemtest.BypassCheck{Off: true}
	rep, err = idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	require.NoError(t, rep.Err())
	// Watching only orders, the phase's own table, finds nothing either.
	cfg.Bypass = idemtest.BypassCheck{Tables: []string{b.schema + ".orders"}}
	rep, err = idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	require.NoError(t, rep.Err())
}

// A not-idempotent flow: the gateway has no idempotency keys, so the phase
// declares ForeignNotIdempotent and supplies a reconcile hook that asks the
// gateway. A truthful hook passes every scenario; one that answers "not
// done" without looking makes the runner send again, which only the user's
// Check can see: the kit cannot know a verdict was wrong.
func TestCatchesAReconcileHookThatLies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := idemtest.Config[orderInput]{
		Pool: b.pool, Input: orderInput{Item: "book"},
		Check: func(_ context.Context, key *idemtype.KeyRecord) error { return b.provider.ExpectOne(key.Key) },
	}

	cfg.Flow = b.notifyFlow("notify.truthful", false)
	rep := idemtest.Explore(t, cfg)
	require.Len(t, rep.Scenarios, 2*5+1)
	steps := strings.Join(scenarioNamed(t, rep, "crash_after_foreign@notified").Steps, "\n")
	require.Contains(t, steps, "-> needs_reconcile")
	require.Contains(t, steps, "reconcile verdict for notified: happened")

	cfg.Flow = b.notifyFlow("notify.lying", true)
	rep, err := idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.Equal(t, []string{"crash_before_commit@notified", "crash_after_foreign@notified", "serialization_failure@notified", "lease_takeover@notified"}, failedNames(rep))
	require.Contains(t, rep.Err().Error(), "reconcile verdict for notified: not happened, so the phase runs again")
	require.Contains(t, rep.Err().Error(), "Check: provider made 2 effects for")
}

// A response with a value generated per run differs from the baseline's
// under the default comparator; EqualJSON ignoring it accepts it.
func TestGeneratedValuesNeedAComparator(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := idem.MustNewFlow("tokens.issue", []idem.Phase[orderInput]{{
		Name: "issued",
		Do: func(context.Context, idem.Tx, *idem.Attempt[orderInput]) (idem.Result, error) {
			return idem.RespondJSON(http.StatusCreated, map[string]any{"token": rand.Text(), "item": "book"}), nil
		},
	}}, nil)
	cfg := idemtest.Config[orderInput]{Pool: b.pool, Flow: flow, Kinds: []idemtest.Kind{idemtest.CrashBeforeCommit}}
	rep, err := idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.Equal(t, []string{"crash_before_commit@issued"}, failedNames(rep))
	require.Contains(t, rep.Err().Error(), "the final response is not the uninterrupted run's: body")

	cfg.Compare = idemtest.EqualJSON("token")
	idemtest.Explore(t, cfg)
}

// Explore fails the test with the account; Run is what it reports.
func TestExploreFailsTheTestWithTheAccount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := b.orderFlow("orders.create", func(ctx context.Context, run *idem.Attempt[orderInput]) (string, error) {
		e, err := b.provider.Do(ctx, "", run.Key().Key)
		return e.ID, err
	})
	rec := &recordingTB{TB: t}
	cfg := b.config(flow)
	cfg.Kinds = []idemtest.Kind{idemtest.CrashBeforeCommit}
	idemtest.Explore(rec, cfg)
	require.True(t, rec.failed)
	require.Len(t, rec.logs, 1)
	require.Contains(t, rec.logs[0], "3 scenarios over 3 phases (0 with a foreign call), 1 failed")
	require.Contains(t, rec.fatal, "scenario crash_before_commit@charged")
	require.Contains(t, rec.fatal, "violated:\n  - Check: provider made 2 effects for")
}

// recordingTB records what Explore logs and the failure it reports, instead
// of failing the real test.
type recordingTB struct {
	testing.TB
	mu     sync.Mutex
	logs   []string
	fatal  string
	failed bool
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Log(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprint(args...))
}

func (r *recordingTB) Fatal(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fatal, r.failed = fmt.Sprint(args...), true
}

// notifyFlow makes one not-idempotent call (the provider is called without
// a key, so it never deduplicates) and reconciles by asking the provider,
// truthfully or not.
func (b *bundle) notifyFlow(name string, lie bool) *idem.Flow[orderInput] {
	return idem.MustNewFlow(name, []idem.Phase[orderInput]{
		{
			Name:    "notified",
			Foreign: idem.ForeignNotIdempotent,
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
				err := run.Foreign(ctx, "notify", func(ctx context.Context, _ string) error {
					_, err := b.provider.Do(ctx, "", run.Key().Key) // no keys: a new message per call
					return err
				})
				return idem.Advance(), err
			},
			Reconcile: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.ReconcileVerdict, error) {
				if lie || len(b.provider.Effects(run.Key().Key)) == 0 {
					return idem.ReconcileNotHappened(), nil
				}
				return idem.ReconcileHappened(idem.Advance()), nil
			},
		},
		{
			Name: "responded",
			Do: func(context.Context, idem.Tx, *idem.Attempt[orderInput]) (idem.Result, error) {
				return idem.RespondJSON(http.StatusAccepted, map[string]string{"status": "notified"}), nil
			},
		},
	}, nil)
}

// A not-idempotent call repeated without a reconcile verdict is the
// runner's (or the store's) bug, not the flow's, and the kit checks for it
// on its own. A store that loses the durable mark before the call makes the
// runner re-run the phase blindly after a crash.
func TestCatchesANotIdempotentCallRepeatedBlindly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store, err := pgstore.New(b.pool, &pgstore.Config{Schema: b.schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	rep, err := idemtest.ExploreContext(context.Background(), idemtest.Config[orderInput]{
		Store: markLosingStore{store}, Pool: b.pool,
		Flow: b.notifyFlow("notify.unmarked", false), Input: orderInput{Item: "book"},
	})
	require.NoError(t, err)
	t.Log(rep.Summary())
	// The takeover scenario passes: its paused worker, which made the call,
	// always runs on the kit's own pgstore.Store, whose mark is real.
	require.Equal(t, []string{"crash_before_commit@notified", "crash_after_foreign@notified", "serialization_failure@notified"}, failedNames(rep))
	require.Contains(t, rep.Err().Error(), `the not-idempotent foreign call "notify" of phase "notified" ran 2 times with 0 reconcile verdicts of not happened between: it was repeated blindly`)

	// After a serialization failure the runner itself sends the key to
	// reconciliation, but with no mark there is no call in doubt as far as
	// the store tells: reconcile resumes the key, and the repeat shows.
	lost := scenarioNamed(t, rep, "serialization_failure@notified")
	require.Contains(t, lost.Violations[0], "repeated blindly")
}

type markLosingStore struct{ idemdriver.Store }

func (markLosingStore) MarkForeign(context.Context, idemdriver.LockRef, string) error { return nil }

// A phase that, when a statement fails, writes the row through the pool
// instead, "so that it is not lost": the hook scenarios never make a
// statement fail, so they all pass. Only the network can: a wire scenario
// whose lost or stalled reply fails the INSERT has the fallback commit a
// row on its own, and the retry, running the phase again, a second. The
// user's Check sees it.
//
// The bypass check cannot help here: wire scenarios run side by side, so a
// window of transaction ids is no one scenario's.
func TestWireScenariosCatchAFallbackWriteOutsideTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert := `INSERT INTO audit (key_id, what) VALUES ($1, 'order created: ' || $2::text)`
	flow := idem.MustNewFlow("orders.fallback", []idem.Phase[orderInput]{{
		Name: "order_created",
		Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
			if _, err := tx.Exec(ctx, insert, run.Key().ID, run.Key().Key); err != nil {
				// The bug: the transaction is gone, the pool is not.
				if _, err := b.pool.Exec(context.WithoutCancel(ctx), insert, run.Key().ID, run.Key().Key); err != nil {
					return idem.Result{}, err
				}
			}
			return idem.RespondJSON(http.StatusCreated, map[string]string{"status": "created"}), nil
		},
	}}, nil)
	cfg := idemtest.Config[orderInput]{
		Pool: b.pool, DatabaseURL: b.url, Flow: flow, Input: orderInput{Item: "book"},
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			var n int
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM audit WHERE what = 'order created: ' || $1::text`, key.Key).Scan(&n); err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("%d audit rows for the key, want 1", n)
			}
			return nil
		},
	}
	rep, err := idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(rep.Summary())
	failed := map[idemtest.Kind]int{}
	for _, s := range rep.Failed() {
		failed[s.Kind]++
		require.Equal(t, []string{"Check: 2 audit rows for the key, want 1"}, s.Violations, s.Name)
	}
	require.Positive(t, failed[idemtest.LostReply])
	require.Positive(t, failed[idemtest.StalledReply])
	require.Len(t, failed, 2, "only wire scenarios fail")
	// Each failed beside others first, and again alone: no lock contention
	// explains it.
	require.Contains(t, rep.Summary(), fmt.Sprintf("5 scenarios over 1 phase (0 with a foreign call) and %d wire scenarios over %d round trips (%d failed beside others and ran again alone), %d failed",
		2*rep.RoundTrips, rep.RoundTrips, len(rep.Failed()), len(rep.Failed())))
	require.Contains(t, rep.Err().Error(), "scenario lost_reply@")
	require.Contains(t, rep.Err().Error(), "is lost after Postgres ran it, and the worker's connection is reset")
}
