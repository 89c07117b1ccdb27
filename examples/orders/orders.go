// Package orders is an endpoint of the kind a chi + sqlc + goose team
// writes, made retry-safe with idem: POST /orders creates an order for the
// caller's tenant, charges it through a payment provider and answers 201.
//
// The queries are sqlc's (query.sql, generated into package db), and every
// one of them runs inside a phase through db.New(tx), so it commits with the
// phase's recovery point or not at all. The tenant comes from the key's
// scope (Attempt.Key().Scope), never from the request's context, because
// the completer re-drives a request whose client gave up without one. The order
// records the key that created it in a nullable foreign-key column, which
// sqlc types pgtype.Int8. docs/pgx-sqlc.md explains each choice.
package orders

//go:generate go run github.com/sqlc-dev/sqlc/cmd/sqlc@v1.29.0 generate

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/orders/db"
)

// Schema is schema.sql: the service's tables, to apply after idem's
// migrations (a goose migration in a real service).
//
//go:embed schema.sql
var Schema string

// FlowName is the flow's name, stored with every key.
const FlowName = "orders.create"

// The phases, in order. Their names are the recovery points stored on keys:
// treat them like column names.
const (
	PhaseOrderCreated = "order_created"
	PhaseCharged      = "charged"
	PhaseResponded    = "responded"
)

// Params is the body of POST /orders. The tenant is not in it: it is the
// key's scope, derived from authentication.
type Params struct {
	SKU      string `json:"sku"`
	Quantity int32  `json:"quantity"`
}

// Payments is the payment provider. It must deduplicate on idempotencyKey,
// as Stripe does: the same key charges once, however often it is sent.
type Payments interface {
	Charge(ctx context.Context, idempotencyKey string, c ChargeRequest) (chargeID string, err error)
}

// ChargeRequest is what one order is charged.
type ChargeRequest struct {
	Tenant      string
	OrderID     int64
	AmountCents int64
}

// ScopePrefix starts every scope of this service: the scope of tenant
// "acme" is "tenant:acme".
const ScopePrefix = "tenant:"

// TenantOf returns the tenant a key's scope names.
func TenantOf(scope string) (string, error) {
	tenant, ok := strings.CutPrefix(scope, ScopePrefix)
	if !ok || tenant == "" {
		return "", fmt.Errorf("orders: scope %q names no tenant", scope)
	}
	return tenant, nil
}

// Order is the response body.
type Order struct {
	ID          int64  `json:"id"`
	SKU         string `json:"sku"`
	Quantity    int32  `json:"quantity"`
	AmountCents int64  `json:"amount_cents"`
	ChargeID    string `json:"charge_id"`
}

// NewFlow returns the orders.create flow, charging through payments.
func NewFlow(payments Payments) *idem.Flow[Params] {
	return idem.MustNewFlow(FlowName, []idem.Phase[Params]{
		{Name: PhaseOrderCreated, Do: createOrder},
		{Name: PhaseCharged, Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[Params]) (idem.Result, error) {
			return charge(ctx, tx, run, payments)
		}},
		{Name: PhaseResponded, Do: respond},
	}, nil)
}

// createOrder prices the order and inserts it, recording the key that
// created it. An unknown product is a final answer, stored and replayed.
func createOrder(ctx context.Context, tx idem.Tx, run *idem.Attempt[Params]) (idem.Result, error) {
	key := run.Key()
	tenant, err := TenantOf(key.Scope) // not from ctx: the completer runs without the request's
	if err != nil {
		return idem.Result{}, err
	}
	q := db.New(tx) // never db.New(pool): see docs/pgx-sqlc.md
	in := run.Input()
	product, err := q.GetProduct(ctx, db.GetProductParams{TenantID: tenant, Sku: in.SKU})
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.RespondJSON(http.StatusUnprocessableEntity, map[string]string{"error": "unknown_sku", "sku": in.SKU}), nil
	}
	if err != nil {
		return idem.Result{}, err
	}
	order, err := q.CreateOrder(ctx, db.CreateOrderParams{
		TenantID:         tenant,
		Sku:              in.SKU,
		Quantity:         in.Quantity,
		AmountCents:      product.PriceCents * int64(in.Quantity),
		IdempotencyKeyID: pgtype.Int8{Int64: key.ID, Valid: true},
	})
	if err != nil {
		return idem.Result{}, err
	}
	return idem.Advance(), run.SetCheckpoint("order_id", order.ID)
}

// charge makes the phase's one foreign call with the downstream key, and
// records the charge on the order in the same transaction.
func charge(ctx context.Context, tx idem.Tx, run *idem.Attempt[Params], payments Payments) (idem.Result, error) {
	tenant, err := TenantOf(run.Key().Scope)
	if err != nil {
		return idem.Result{}, err
	}
	orderID, err := orderIDOf(run)
	if err != nil {
		return idem.Result{}, err
	}
	q := db.New(tx)
	order, err := q.GetOrder(ctx, db.GetOrderParams{TenantID: tenant, ID: orderID})
	if err != nil {
		return idem.Result{}, err
	}
	var chargeID string
	err = run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
		var err error
		chargeID, err = payments.Charge(ctx, key, ChargeRequest{Tenant: tenant, OrderID: order.ID, AmountCents: order.AmountCents})
		return err
	})
	if err != nil {
		return idem.Result{}, err
	}
	err = q.MarkOrderCharged(ctx, db.MarkOrderChargedParams{TenantID: tenant, ID: orderID, ChargeID: pgtype.Text{String: chargeID, Valid: true}})
	if err != nil {
		return idem.Result{}, err
	}
	payload := fmt.Appendf(nil, `{"order_id": %d, "charge_id": %q}`, orderID, chargeID)
	if err := q.EnqueueOutbox(ctx, db.EnqueueOutboxParams{OrderID: orderID, Topic: "order.charged", Payload: payload}); err != nil {
		return idem.Result{}, err
	}
	return idem.Advance(), nil
}

// respond answers 201 with the order and its Location.
func respond(ctx context.Context, tx idem.Tx, run *idem.Attempt[Params]) (idem.Result, error) {
	tenant, err := TenantOf(run.Key().Scope)
	if err != nil {
		return idem.Result{}, err
	}
	orderID, err := orderIDOf(run)
	if err != nil {
		return idem.Result{}, err
	}
	order, err := db.New(tx).GetOrder(ctx, db.GetOrderParams{TenantID: tenant, ID: orderID})
	if err != nil {
		return idem.Result{}, err
	}
	location := http.Header{"Location": {"/orders/" + strconv.FormatInt(order.ID, 10)}}
	return idem.RespondJSONWith(http.StatusCreated, location, Order{
		ID: order.ID, SKU: order.Sku, Quantity: order.Quantity, AmountCents: order.AmountCents, ChargeID: order.ChargeID.String,
	}), nil
}

// orderIDOf returns the order the first phase created, from its checkpoint.
func orderIDOf(run *idem.Attempt[Params]) (int64, error) {
	var id int64
	ok, err := run.Checkpoint("order_id", &id)
	if err == nil && !ok {
		err = errors.New("orders: no order_id checkpoint")
	}
	return id, err
}
