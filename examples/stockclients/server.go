// Package stockclients is a Stripe-shaped charges API on idem, built from
// the README and docs/http.md as a new user would, for the tests that
// drive it with stock clients: the real stripe-go and go-retryablehttp, at
// their default settings, through a proxy that drops responses, with the
// server killed by SIGKILL. POST /v1/charges runs three phases: record the
// charge, charge the card network with the downstream key, respond. POST
// /webhooks/stripe books Stripe-signed events once.
package stockclients

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
)

// Schema is the business tables of the example.
const Schema = `
CREATE TABLE IF NOT EXISTS charges (
	id bigserial PRIMARY KEY,
	key_id bigint REFERENCES idem_keys (id) ON DELETE SET NULL,
	order_id text NOT NULL,
	amount bigint NOT NULL,
	card_charge text,
	status text NOT NULL DEFAULT 'pending'
);
CREATE TABLE IF NOT EXISTS events (id text PRIMARY KEY, type text NOT NULL);`

// ChargeParams is what a client sends: stripe-go's form (amount,
// currency, metadata[order_id]) or the same as JSON.
type ChargeParams struct {
	Amount   int64             `json:"amount"`
	Currency string            `json:"currency"`
	Metadata map[string]string `json:"metadata"`
}

// CardNetwork charges a card; it deduplicates on the key it is given.
type CardNetwork struct {
	URL    string
	Client *http.Client
}

// Charge asks the card network for a charge under key and returns its id.
func (c *CardNetwork) Charge(ctx context.Context, key, order string, amount int64) (string, error) {
	body, _ := json.Marshal(map[string]any{"order_id": order, "amount": amount})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	res, err := c.Client.Do(req)
	if err != nil {
		return "", fmt.Errorf("card network: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("card network: status %d", res.StatusCode)
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("card network: %w", err)
	}
	return out.ID, nil
}

// Flow is POST /v1/charges in three atomic phases.
func Flow(card *CardNetwork) *idem.Flow[ChargeParams] {
	return idem.MustNewFlow("charges.create", []idem.Phase[ChargeParams]{
		{Name: "charge_recorded", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[ChargeParams]) (idem.Result, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO charges (key_id, order_id, amount) VALUES ($1, $2, $3) RETURNING id`,
				run.Key().ID, run.Input().Metadata["order_id"], run.Input().Amount).Scan(&id)
			if err != nil {
				return idem.Result{}, err
			}
			return idem.Advance(), run.SetCheckpoint("charge_id", id)
		}},
		{Name: "card_charged", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[ChargeParams]) (idem.Result, error) {
			var id int64
			_, err := run.Checkpoint("charge_id", &id)
			if err != nil {
				return idem.Result{}, err
			}
			var cardCharge string
			// The card network deduplicates on the downstream key: a
			// transient failure is retried here, before the client hears
			// of it (stock clients take a 500 as final).
			err = run.ForeignRetrying(ctx, "card", idem.ForeignRetry{}, func(ctx context.Context, key string) error {
				cardCharge, err = card.Charge(ctx, key, run.Input().Metadata["order_id"], run.Input().Amount)
				return err
			})
			if err != nil {
				return idem.Result{}, err
			}
			if _, err := tx.Exec(ctx, `UPDATE charges SET card_charge = $1 WHERE id = $2`, cardCharge, id); err != nil {
				return idem.Result{}, err
			}
			return idem.Advance(), nil
		}},
		{Name: "responded", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[ChargeParams]) (idem.Result, error) {
			var id int64
			_, err := run.Checkpoint("charge_id", &id)
			if err != nil {
				return idem.Result{}, err
			}
			if _, err := tx.Exec(ctx, `UPDATE charges SET status = 'succeeded' WHERE id = $1`, id); err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(http.StatusOK, map[string]any{
				"id": fmt.Sprintf("ch_%d", id), "object": "charge", "amount": run.Input().Amount,
				"currency": run.Input().Currency, "status": "succeeded", "metadata": run.Input().Metadata,
			}), nil
		}},
	}, nil)
}

// Event is the part of a Stripe event the webhook flow reads.
type Event struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

// EventFlow books an event once.
var EventFlow = idem.MustNewFlow("stripe.events", []idem.Phase[Event]{
	{Name: "booked", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[Event]) (idem.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO events (id, type) VALUES ($1, $2)`, run.Input().ID, run.Input().Type); err != nil {
			return idem.Result{}, err
		}
		return idem.RespondJSON(http.StatusOK, map[string]bool{"received": true}), nil
	}},
}, &idem.FlowConfig[Event]{Retention: 4 * 24 * time.Hour})

// MonitorURL is where Mux serves the charges' status monitor: a charge
// sent with "Prefer: respond-async" is answered 202 with its Location.
const MonitorURL = "/v1/charges/requests"

// Mux serves the charges flow (Stripe profile, default DefaultWait,
// respond-async honoured, its runs without a client bounded by detached,
// nil: the process's default) with its status monitor, and the webhook
// receiver on runner, whose Config.Flows holds both flows.
func Mux(runner *idem.Runner, charges *idem.Flow[ChargeParams], webhookSecrets []string, detached *idemhttp.DetachedRuns) (*http.ServeMux, error) {
	h, err := idemhttp.New(runner, charges, &idemhttp.Config[ChargeParams]{
		Scope: func(r *http.Request) (string, error) {
			key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || key == "" {
				return "", idemhttp.ErrUnauthenticated
			}
			return "account:" + key, nil
		},
		Profile:      idemhttp.ProfileStripe,
		RespondAsync: true,
		MonitorURL:   MonitorURL,
		Detached:     detached,
	})
	if err != nil {
		return nil, err
	}
	verify, err := idemhttp.StripeSignature(webhookSecrets, 0)
	if err != nil {
		return nil, err
	}
	wh, err := idemhttp.NewWebhook(runner, EventFlow, &idemhttp.WebhookConfig{
		Provider: "stripe", EventID: idemhttp.JSONValue("id"), Verify: verify,
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", h)
	mux.Handle("GET "+MonitorURL, h.Monitor()) // its Scope authenticates
	mux.Handle("POST /webhooks/stripe", wh)
	return mux, nil
}

// Migrate creates the business tables.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, Schema); err != nil {
		return errors.Join(errors.New("stockclients: schema"), err)
	}
	return nil
}
