package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// joinedOrder is a three-phase flow whose last phase joins the second
// (Phase.JoinPrevious): the order row commits alone, then the charge, its
// record and the receipt job commit together, and the response with them.
func joinedOrder(payments *idemtest.Provider) *idem.Flow[rideInput] {
	return joinedOrderFlow("orders.joined", payments, false, orderSubject)
}

// orderSubject is what the charge is for, as the provider sees it: the
// order's row id.
func orderSubject(_ *idemtype.KeyRecord, orderID int64) string { return fmt.Sprint("order:", orderID) }

// requestSubject names the charge after the request instead, which every
// retry of it shares.
func requestSubject(key *idemtype.KeyRecord, _ int64) string { return "request:" + key.Key }

// joinedOrderFlow is joinedOrder; with chargeJoins the charge joins the
// order's insert too, and all three phases share one transaction. subject
// says what the charge is for.
func joinedOrderFlow(name string, payments *idemtest.Provider, chargeJoins bool, subject func(*idemtype.KeyRecord, int64) string) *idem.Flow[rideInput] {
	return idem.MustNewFlow(name, []idem.Phase[rideInput]{
		{
			Name: "order_created",
			Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO orders (origin) VALUES ($1) RETURNING id`, a.Input().Origin).Scan(&id); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), a.SetCheckpoint("order_id", id)
			},
		},
		{
			Name:         "order_charged",
			JoinPrevious: chargeJoins,
			Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
				var orderID int64
				if _, err := a.Checkpoint("order_id", &orderID); err != nil {
					return idem.Result{}, err
				}
				var charge idemtest.Effect
				if err := a.Foreign(ctx, "charge", func(ctx context.Context, key string) (err error) {
					charge, err = payments.Do(ctx, key, subject(a.Key(), orderID))
					return err
				}); err != nil {
					return idem.Result{}, err
				}
				if _, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE id = $2`, charge.ID, orderID); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), a.SetCheckpoint("charge_id", charge.ID)
			},
		},
		{
			Name:         "receipt_enqueued",
			JoinPrevious: true,
			Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
				var orderID int64
				var chargeID string
				if _, err := a.Checkpoint("order_id", &orderID); err != nil {
					return idem.Result{}, err
				}
				// The joined phase sees the checkpoint its transaction's
				// earlier phase set, before anything committed.
				if ok, err := a.Checkpoint("charge_id", &chargeID); err != nil || !ok {
					return idem.Result{}, fmt.Errorf("no charge_id checkpoint (found %v): %v", ok, err)
				}
				if _, err := tx.Exec(ctx, `INSERT INTO receipts (order_id) VALUES ($1)`, orderID); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"status": "charged"}), nil
			},
		},
	}, nil)
}

func joinedOrderTables(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE orders (id bigserial PRIMARY KEY, origin text NOT NULL, charge_id text);
		CREATE TABLE receipts (id bigserial PRIMARY KEY, order_id bigint NOT NULL)`)
	require.NoError(t, err)
}

// Joined phases commit once: the charge's record and the receipt carry the
// same transaction id, while the order row, from the phase before, has its
// own. Each phase still reports its own commit.
func TestJoinedPhasesShareOneCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	joinedOrderTables(t, b.pool)
	payments := &idemtest.Provider{}
	flow := joinedOrder(payments)
	var mu sync.Mutex
	var committed []string
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}, Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
		if e.Kind == idem.EventPhaseCommitted {
			mu.Lock()
			defer mu.Unlock()
			committed = append(committed, e.Phase)
		}
	})})

	out, err := r.Execute(context.Background(), flow, b.request("k1", rideInput{Origin: "home"}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)

	var created, charged, receipt string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT o.xmin::text, r.xmin::text FROM orders o JOIN receipts r ON r.order_id = o.id`).Scan(&charged, &receipt))
	require.Equal(t, charged, receipt, "the charge's record and the receipt commit in one transaction")
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT xmin::text FROM idem_keys WHERE key = 'k1'`).Scan(&created))
	require.Equal(t, receipt, created, "the key's finishing update commits with them")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"order_created", "order_charged", "receipt_enqueued"}, committed)
	require.Len(t, payments.Effects(""), 1)
}

// exploreJoinedOrders runs the crash kit over flow on tables of its own,
// with every wire kind, and checks it reached all three phases; check says
// what the order, charge and receipt counts must satisfy.
func exploreJoinedOrders(t *testing.T, flow *idem.Flow[rideInput], payments *idemtest.Provider, check func(orders, charged, receipts int) error) {
	t.Helper()
	schema := idemtest.NewSchema(t)
	joinedOrderTables(t, schema.Pool)
	rep := idemtest.Explore(t, idemtest.Config[rideInput]{
		Pool:        schema.Pool,
		DatabaseURL: schema.URL,
		Flow:        flow,
		Input:       rideInput{Origin: "home"},
		Scope:       "tenant:" + flow.Name(),
		Providers:   []idemtest.FakeProvider{payments},
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			var orders, charged, receipts int
			if err := schema.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders),
				(SELECT count(*) FROM orders WHERE charge_id IS NOT NULL), (SELECT count(*) FROM receipts)`).Scan(&orders, &charged, &receipts); err != nil {
				return err
			}
			return check(orders, charged, receipts)
		},
	})
	require.Equal(t, []string{"order_created", "order_charged", "receipt_enqueued"}, rep.Phases)
	require.Empty(t, rep.Unreached)
}

// The crash kit explores joined phases like any others: a crash before the
// shared commit, after it, a lost acknowledgement, a serialization failure
// and a takeover at each phase, and the lost and stalled replies of every
// round trip; the charge happens once and the receipt exists once.
func TestJoinedPhasesUnderTheCrashKit(t *testing.T) {
	t.Parallel()
	payments := &idemtest.Provider{}
	exploreJoinedOrders(t, joinedOrder(payments), payments, func(_, charged, receipts int) error {
		if charged != receipts {
			return fmt.Errorf("%d charged orders and %d receipts", charged, receipts)
		}
		return nil
	})
}

// The same with all three phases in one transaction: the charge, which
// makes the foreign call, joins the order's insert, and a crash anywhere
// before the one commit re-runs all three, the charge with its one
// downstream key. The charge is for the request, which every retry shares.
func TestAllPhasesJoinedUnderTheCrashKit(t *testing.T) {
	t.Parallel()
	payments := &idemtest.Provider{}
	exploreJoinedOrders(t, joinedOrderFlow("orders.onetx", payments, true, requestSubject), payments, func(orders, charged, receipts int) error {
		// Scenarios share the tables: in one transaction, no order is
		// ever left without its charge or its receipt.
		if orders != charged || orders != receipts {
			return fmt.Errorf("%d orders, %d charged, %d receipts; want as many of each", orders, charged, receipts)
		}
		return nil
	})
}

// A transaction of joined phases makes at most one foreign call between
// them: the second is refused, names the phase that made the first, and the
// request fails without committing either phase.
func TestJoinedPhasesMakeOneForeignCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	payments := &idemtest.Provider{}
	call := func(ctx context.Context, a *idem.Attempt[rideInput]) error {
		return a.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
			_, err := payments.Do(ctx, key, "subject")
			return err
		})
	}
	flow := idem.MustNewFlow("two.calls", []idem.Phase[rideInput]{
		{Name: "first", Do: func(ctx context.Context, _ idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
			return idem.Advance(), call(ctx, a)
		}},
		{Name: "second", JoinPrevious: true, Do: func(ctx context.Context, _ idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
			if err := call(ctx, a); err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(http.StatusOK, nil), nil
		}},
	}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	_, err := r.Execute(context.Background(), flow, b.request("k1", rideInput{}))
	require.ErrorIs(t, err, idem.ErrSecondForeignCall)
	require.ErrorContains(t, err, `phase "second" joins the transaction of phase "first"`)
	require.Len(t, payments.Calls(), 1)
	require.Equal(t, idemtype.RecoveryPointStarted, b.key(t, "k1").RecoveryPoint)
}

func TestJoinPreviousIsChecked(t *testing.T) {
	t.Parallel()
	do := func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
		return idem.RespondJSON(http.StatusOK, nil), nil
	}
	reconcile := func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.ReconcileVerdict, error) {
		return idem.ReconcileUnknown("test"), nil
	}
	for _, tt := range []struct {
		name   string
		phases []idem.Phase[rideInput]
		want   string
	}{
		{"the first phase", []idem.Phase[rideInput]{{Name: "a", Do: do, JoinPrevious: true}},
			`the first phase has no phase before it to join`},
		{"a not-idempotent phase", []idem.Phase[rideInput]{{Name: "a", Do: do},
			{Name: "b", Do: do, JoinPrevious: true, Foreign: idem.ForeignNotIdempotent, Reconcile: reconcile}},
			`phase "b" makes a not-idempotent foreign call, so it commits alone and cannot join "a"`},
		{"a not-idempotent phase's transaction", []idem.Phase[rideInput]{{Name: "a", Do: do, Foreign: idem.ForeignNotIdempotent, Reconcile: reconcile},
			{Name: "b", Do: do, JoinPrevious: true}},
			`phase "b" cannot join "a", which makes a not-idempotent foreign call`},
		{"another isolation level", []idem.Phase[rideInput]{{Name: "a", Do: do}, {Name: "b", Do: do},
			{Name: "c", Do: do, JoinPrevious: true, Isolation: pgx.Serializable}},
			`phase "c" joins the transaction of "b", whose isolation level it cannot change`},
		{"another isolation level down a chain", []idem.Phase[rideInput]{{Name: "a", Do: do, Isolation: pgx.RepeatableRead},
			{Name: "b", Do: do, JoinPrevious: true}, {Name: "c", Do: do, JoinPrevious: true, Isolation: pgx.Serializable}},
			`phase "c" joins the transaction of "a"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := idem.NewFlow("f", tt.phases, nil)
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := idem.NewFlow("f", []idem.Phase[rideInput]{{Name: "a", Do: do, Isolation: pgx.RepeatableRead},
		{Name: "b", Do: do, JoinPrevious: true, Isolation: pgx.RepeatableRead}, {Name: "c", Do: do, JoinPrevious: true}}, nil)
	require.NoError(t, err, "a joined phase may repeat its transaction's isolation level or leave it empty")
}

// A key in flight when its flow gains a JoinPrevious resumes in the middle
// of the new chain, at the isolation level of the chain's first phase.
func TestResumingInsideAJoinedChainKeepsItsIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen string
	flow := func(join bool) *idem.Flow[rideInput] {
		return idem.MustNewFlow("joined.later", []idem.Phase[rideInput]{
			{Name: "first", Isolation: pgx.Serializable, Do: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
				return idem.Advance(), nil
			}},
			{Name: "second", JoinPrevious: join, Do: func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) (idem.Result, error) {
				if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&seen); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusOK, nil), nil
			}},
		}, nil)
	}
	before := flow(false)
	crashing := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{before}, Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterCommit && at.Phase == "first" {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	_, err := crashing.Execute(context.Background(), before, b.request("k1", rideInput{}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	require.Equal(t, "first", b.key(t, "k1").RecoveryPoint)

	b.clock.Advance(idem.LeaseDefault + time.Second)
	after := flow(true)
	out, err := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{after}}).Execute(context.Background(), after, b.request("k1", rideInput{}))
	require.NoError(t, err)
	require.True(t, out.TookOver)
	require.Equal(t, "serializable", seen)
}

// Joining a charge to the insert of the row it charges for is a mistake
// when the charge names that row: the insert rolls back with the crash, the
// retry inserts a row with a new id, and the provider sees the one
// downstream key sent with another charge. The crash kit finds it (as a
// provider checking its idempotency keys would, in production).
func TestTheCrashKitFindsAJoinThatRenamesTheCharge(t *testing.T) {
	t.Parallel()
	schema := idemtest.NewSchema(t)
	joinedOrderTables(t, schema.Pool)
	payments := &idemtest.Provider{}
	rep, err := idemtest.ExploreContext(context.Background(), idemtest.Config[rideInput]{
		Pool:      schema.Pool,
		Flow:      joinedOrderFlow("orders.renamed", payments, true, orderSubject),
		Input:     rideInput{Origin: "home"},
		Scope:     "tenant:renamed",
		Providers: []idemtest.FakeProvider{payments},
		Kinds:     []idemtest.Kind{idemtest.CrashBeforeCommit},
	})
	require.NoError(t, err)
	require.Error(t, rep.Err(), "a crash before the shared commit renames the order the charge is for")
	var failed *idemtest.Scenario
	for i := range rep.Scenarios {
		if rep.Scenarios[i].Failed() {
			failed = rep.Scenarios[i]
			break
		}
	}
	require.NotNil(t, failed)
	require.Contains(t, strings.Join(failed.Steps, "\n"), "was first used for subject")
}
