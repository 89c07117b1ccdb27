// Package testflows holds the two small flows the CLI's tests drive: the
// test binary runs them in-process to leave keys in every state, and the
// flowapp binary (testdata/flowapp) registers them with idemcli, as an
// application's own CLI would, so complete and reconcile have flows to run.
//
// The "providers" are tables written through a pool of their own, outside
// the phase's transaction, so their effects survive a phase that rolls back,
// as a real provider's would.
package testflows

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-idem/idem"
)

// Schema creates the flows' tables; idem_keys must exist (orders reference
// it, ON DELETE SET NULL).
const Schema = `
CREATE TABLE orders (
    id     bigserial PRIMARY KEY,
    key_id bigint REFERENCES idem_keys (id) ON DELETE SET NULL,
    item   text NOT NULL
);
CREATE INDEX orders_key_id ON orders (key_id);
-- charges is an idempotent payment provider's ledger: one row per
-- downstream key, however many times it is called.
CREATE TABLE charges (downstream_key text PRIMARY KEY, amount int NOT NULL, calls int NOT NULL DEFAULT 1);
-- texts_sent is a gateway without idempotency: every call is a message.
CREATE TABLE texts_sent (id bigserial PRIMARY KEY, ref text NOT NULL);`

// Provider is what the flows' foreign calls write through. *pgxpool.Pool
// implements it.
type Provider interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Order is the input of the orders flow.
type Order struct {
	Item   string `json:"item"`
	Amount int    `json:"amount"`
}

// Orders is rocket-rides in miniature: create an order, charge it through
// an idempotent provider, respond 201.
func Orders(provider Provider) *idem.Flow[Order] {
	return idem.MustNewFlow("orders.create", []idem.Phase[Order]{
		{
			Name: "order_created",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[Order]) (idem.Result, error) {
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO orders (key_id, item) VALUES ($1, $2) RETURNING id`,
					run.Key().ID, run.Input().Item).Scan(&id); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), run.SetCheckpoint("order_id", id)
			},
		},
		{
			Name: "charged",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[Order]) (idem.Result, error) {
				err := run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
					_, err := provider.Exec(ctx, `INSERT INTO charges (downstream_key, amount) VALUES ($1, $2)
						ON CONFLICT (downstream_key) DO UPDATE SET calls = charges.calls + 1`, key, run.Input().Amount)
					return err
				})
				return idem.Advance(), err
			},
		},
		{
			Name: "responded",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[Order]) (idem.Result, error) {
				var id int64
				if _, err := run.Checkpoint("order_id", &id); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"order_id": id}), nil
			},
		},
	}, nil)
}

// Text is the input of the texts flow. Unknown makes its reconcile hook
// unable to tell, as a gateway whose lookup is down.
type Text struct {
	To      string `json:"to"`
	Unknown bool   `json:"unknown,omitempty"`
}

// Texts sends one message through a gateway without idempotency keys, so
// its phase is not idempotent and has a reconcile hook that asks the
// gateway what it sent.
func Texts(gateway Provider) *idem.Flow[Text] {
	sent := func(ctx context.Context, run *idem.Attempt[Text]) (bool, error) {
		var n int
		err := gateway.QueryRow(ctx, `SELECT count(*) FROM texts_sent WHERE ref = $1`, run.IdempotencyKey()).Scan(&n)
		return n > 0, err
	}
	return idem.MustNewFlow("texts.send", []idem.Phase[Text]{{
		Name:    "sent",
		Foreign: idem.ForeignNotIdempotent,
		Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[Text]) (idem.Result, error) {
			err := run.Foreign(ctx, "send_text", func(ctx context.Context, ref string) error {
				_, err := gateway.Exec(ctx, `INSERT INTO texts_sent (ref) VALUES ($1)`, ref)
				return err
			})
			return idem.RespondJSON(http.StatusCreated, map[string]any{"sent": true}), err
		},
		Reconcile: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[Text]) (idem.ReconcileVerdict, error) {
			if run.Input().Unknown {
				return idem.ReconcileUnknown("the gateway cannot tell"), nil
			}
			ok, err := sent(ctx, run)
			switch {
			case err != nil:
				return idem.ReconcileVerdict{}, err
			case ok:
				return idem.ReconcileHappened(idem.RespondJSON(http.StatusCreated, map[string]any{"sent": true})), nil
			}
			return idem.ReconcileNotHappened(), nil
		},
	}}, nil)
}
