package orders_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/orders"
	"github.com/go-idem/idem/examples/orders/db"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

func TestMain(m *testing.M) { idemtest.Main(m) }

// fakePayments is the payment provider in tests: an idemtest.Provider,
// which deduplicates on the key as Stripe does, charging once per order.
type fakePayments struct{ *idemtest.Provider }

func (p fakePayments) Charge(ctx context.Context, key string, c orders.ChargeRequest) (string, error) {
	e, err := p.Do(ctx, key, orderSubject(c.OrderID))
	return e.ID, err
}

func orderSubject(orderID int64) string { return fmt.Sprint("order:", orderID) }

// ordersTables creates the service's tables in the test's schema and a
// product for tenants acme and globex, at different prices.
func ordersTables(t *testing.T, schema *idemtest.Schema) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	_, err := schema.Pool.Exec(ctx, orders.Schema)
	require.NoError(t, err)
	_, err = schema.Pool.Exec(ctx, `INSERT INTO products (tenant_id, sku, price_cents) VALUES ('acme', 'rocket', 1500), ('globex', 'rocket', 900)`)
	require.NoError(t, err)
	return schema.Pool
}

// exactlyOneOrderAndOneCharge is the business invariant of a finished key:
// one order for it, charged, one outbox message, and one charge at the
// provider for the order.
func exactlyOneOrderAndOneCharge(pool *pgxpool.Pool, payments *idemtest.Provider) func(context.Context, *idemtype.KeyRecord) error {
	return func(ctx context.Context, key *idemtype.KeyRecord) error {
		q := db.New(pool) // outside any phase, the pool is right
		n, err := q.CountOrdersForKey(ctx, pgtype.Int8{Int64: key.ID, Valid: true})
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("%d orders for the key, want 1", n)
		}
		var orderID int64
		var status string
		var outbox int
		err = pool.QueryRow(ctx, `SELECT o.id, o.status, (SELECT count(*) FROM outbox WHERE order_id = o.id)
			FROM orders o WHERE o.idempotency_key_id = $1`, key.ID).Scan(&orderID, &status, &outbox)
		if err != nil {
			return err
		}
		if status != "charged" || outbox != 1 {
			return fmt.Errorf("order %d is %s with %d outbox messages, want charged with 1", orderID, status, outbox)
		}
		return payments.ExpectOne(orderSubject(orderID))
	}
}

func TestCreateOrder(t *testing.T) {
	t.Parallel()
	schema := idemtest.NewSchema(t) // idem's tables migrated; a schema of this test's own
	pool := ordersTables(t, schema) // the service's tables and a product
	payments := &idemtest.Provider{}
	idemtest.Explore(t, idemtest.Config[orders.Params]{
		Pool:      pool,
		Flow:      orders.NewFlow(fakePayments{payments}),
		Input:     orders.Params{SKU: "rocket", Quantity: 2},
		Scope:     "tenant:acme",
		Compare:   idemtest.EqualJSON("id", "charge_id"), // generated afresh by every run
		Providers: []idemtest.FakeProvider{payments},
		Check:     exactlyOneOrderAndOneCharge(pool, payments),
	})
}

// The declined path (an unknown product) at every crash point: a stored
// 422, no order, no charge.
func TestCreateOrderUnknownSKU(t *testing.T) {
	t.Parallel()
	schema := idemtest.NewSchema(t)
	pool := ordersTables(t, schema)
	payments := &idemtest.Provider{}
	idemtest.Explore(t, idemtest.Config[orders.Params]{
		Pool: pool, Flow: orders.NewFlow(fakePayments{payments}),
		Input: orders.Params{SKU: "warp-drive", Quantity: 1}, Scope: "tenant:acme",
		Providers: []idemtest.FakeProvider{payments},
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			n, err := db.New(pool).CountOrdersForKey(ctx, pgtype.Int8{Int64: key.ID, Valid: true})
			if err == nil && (n != 0 || len(payments.Effects("")) != 0) {
				err = fmt.Errorf("%d orders and %d charges, want none", n, len(payments.Effects("")))
			}
			return err
		},
	})
}

type bundle struct {
	pool     *pgxpool.Pool
	store    *pgstore.Store
	payments *idemtest.Provider
	flow     *idem.Flow[orders.Params]
}

func setup(t *testing.T) *bundle {
	t.Helper()
	schema := idemtest.NewSchema(t)
	pool := ordersTables(t, schema)
	store, err := pgstore.New(pool, nil)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	b := &bundle{pool: pool, store: store, payments: &idemtest.Provider{}}
	b.flow = orders.NewFlow(fakePayments{b.payments})
	return b
}

func (b *bundle) runner(t *testing.T, cfg *idem.Config) *idem.Runner {
	t.Helper()
	if cfg == nil {
		cfg = &idem.Config{}
	}
	cfg.Flows = []idem.AnyFlow{b.flow}
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := idem.NewRunner(b.store, cfg)
	require.NoError(t, err)
	return r
}

func post(t *testing.T, h http.Handler, tenant, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if tenant != "" {
		req.Header.Set(orders.TenantHeader, tenant)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// Over HTTP through chi: the order belongs to the caller's tenant and
// records its key; a retry replays; the same key in another tenant is
// another request.
func TestOrdersOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := orders.NewHandler(b.runner(t, nil), b.flow)
	require.NoError(t, err)
	routes := orders.Routes(h)

	first := post(t, routes, "acme", "order-1", `{"sku": "rocket", "quantity": 2}`)
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	var order orders.Order
	require.NoError(t, json.Unmarshal(first.Body.Bytes(), &order))
	require.Equal(t, int64(3000), order.AmountCents)
	require.Equal(t, fmt.Sprint("/orders/", order.ID), first.Header().Get("Location"))

	again := post(t, routes, "acme", "order-1", `{"sku": "rocket", "quantity": 2}`)
	require.Equal(t, http.StatusCreated, again.Code)
	require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
	require.Equal(t, first.Body.String(), again.Body.String())
	require.Equal(t, first.Header().Get("Location"), again.Header().Get("Location"))

	other := post(t, routes, "globex", "order-1", `{"sku": "rocket", "quantity": 2}`)
	require.Equal(t, http.StatusCreated, other.Code)
	require.Empty(t, other.Header().Get("Idempotent-Replayed"))
	var otherOrder orders.Order
	require.NoError(t, json.Unmarshal(other.Body.Bytes(), &otherOrder))
	require.Equal(t, int64(1800), otherOrder.AmountCents, "globex's price")

	ctx := context.Background()
	key, err := b.store.GetKey(ctx, "tenant:acme", "order-1")
	require.NoError(t, err)
	stored, err := db.New(b.pool).GetOrder(ctx, db.GetOrderParams{TenantID: "acme", ID: order.ID})
	require.NoError(t, err)
	require.Equal(t, pgtype.Int8{Int64: key.ID, Valid: true}, stored.IdempotencyKeyID)

	require.Equal(t, http.StatusUnauthorized, post(t, routes, "", "order-2", `{"sku": "rocket", "quantity": 1}`).Code)
	require.Equal(t, http.StatusUnprocessableEntity, post(t, routes, "acme", "order-3", `{"sku": "rocket", "quantity": 0}`).Code)
}

// The completer re-drives a request its client abandoned with a context of
// its own, without the request's values: the flow still finds its tenant,
// because it reads it from the key's scope.
func TestCompleterFindsTheTenantInTheScope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	clock := idemtest.NewClock(time.Now())
	crash := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{Now: clock.Now}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Phase == orders.PhaseCharged && at.Where == idemtest.HookPhaseStart {
			return idemtest.ErrSimulatedCrash // the process dies after the order was created
		}
		return nil
	})})
	_, err := idem.Execute(ctx, crash, orders.NewFlow(fakePayments{b.payments}), idem.Request{Scope: "tenant:globex", Key: "abandoned"}, orders.Params{SKU: "rocket", Quantity: 3})
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)

	clock.Advance(idem.CompleteIdleForDefault + idem.LeaseDefault)
	res, err := b.runner(t, &idem.Config{Test: idem.TestConfig{Now: clock.Now}}).Complete(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed)

	key, err := b.store.GetKey(ctx, "tenant:globex", "abandoned")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, key.ResponseStatus)
	var order orders.Order
	require.NoError(t, json.Unmarshal(key.ResponseBody, &order))
	require.Equal(t, int64(2700), order.AmountCents, "globex's price, found through the scope")
}

// The trap docs/pgx-sqlc.md warns about: a *db.Queries built once on the
// pool and used inside a phase. It compiles, but its statements commit on
// their own, outside the phase's transaction.
//
// The happy path passes; the kit's bypass check catches the mistake.
func TestQueriesOnThePoolAreCaught(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	queries := db.New(b.pool) // the bug: held on the pool, not built from tx
	pooledFlow := func(name string, config *idem.FlowConfig[orders.Params]) *idem.Flow[orders.Params] {
		return idem.MustNewFlow(name, []idem.Phase[orders.Params]{{
			Name: orders.PhaseOrderCreated,
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orders.Params]) (idem.Result, error) {
				order, err := queries.CreateOrder(ctx, db.CreateOrderParams{
					TenantID: "acme", Sku: run.Input().SKU, Quantity: run.Input().Quantity, AmountCents: 1500,
					IdempotencyKeyID: pgtype.Int8{Int64: run.Key().ID, Valid: true},
				})
				if err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, orders.Order{ID: order.ID}), nil
			},
		}}, config)
	}

	// The happy path is happy.
	flow := pooledFlow("orders.pooled", nil)
	out, err := idem.Execute(ctx, b.runner(t, nil), flow,
		idem.Request{Scope: "tenant:acme", Key: "happy"}, orders.Params{SKU: "rocket", Quantity: 1})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, out.Response.Status)

	// The kit is not.
	rep, err := idemtest.ExploreContext(ctx, idemtest.Config[orders.Params]{
		Pool: b.pool, Flow: flow, Input: orders.Params{SKU: "rocket", Quantity: 1}, Scope: "tenant:acme",
		Compare: idemtest.EqualJSON("id"),
	})
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.Error(t, rep.Err())
	require.Contains(t, rep.Err().Error(), "scenario crash_before_commit@order_created")
	require.Contains(t, rep.Err().Error(), `.orders through a connection other than its transaction`)
}
