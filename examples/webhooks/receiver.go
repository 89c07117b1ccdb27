// Command webhooks is idem's example of an inbound webhook receiver: it
// takes Stripe-shaped events, signed with a Stripe-Signature header, and
// books each payment into a ledger exactly once, however often the
// provider delivers it and whichever of several server processes it
// reaches.
//
// The event id is the idempotency key (idemhttp.NewWebhook), scoped to the
// provider account; the signature is checked before anything is stored;
// the flow has three phases, each in its own transaction:
//
//	event_recorded  insert the webhook_events row
//	ledger_booked   book a payment or a refund into the ledger (other events book nothing)
//	responded       200 {"received": true, "event_id", "ledger_entry"}
//
// A redelivery of a finished event gets the stored 200 and runs nothing; a
// redelivery while it runs a 503 with Retry-After, which the provider
// redelivers; the same event id with another body a 422. The ledger insert
// has no unique constraint to fall back on: the phases are what keep it to
// one entry per event.
//
//	go run ./examples/webhooks serve --database-url postgres://... --secret whsec_...
//
// The README has the whole example; the tests run two serve processes on
// one database and kill one of them mid-event.
package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/migrations"
)

// FlowName is the flow's name, stored with every key.
const FlowName = "stripe.events"

// The flow's phases, in order.
const (
	PhaseEventRecorded = "event_recorded"
	PhaseLedgerBooked  = "ledger_booked"
	PhaseResponded     = "responded"
)

// Retention is how long a finished event is remembered: longer than
// Stripe's redelivery window of three days, so that a late redelivery is
// answered from the stored response rather than booked again.
const Retention = 4 * 24 * time.Hour

// Event is a Stripe-shaped event: the members the receiver reads. Stripe
// sends many more; the receiver ignores them, and the fingerprint covers
// them all but pending_webhooks, which Stripe changes between deliveries
// (see Content).
type Event struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Account string `json:"account,omitempty"` // a Connect account; none for the platform's own events
	Created int64  `json:"created"`
	Data    struct {
		Object struct {
			ID       string `json:"id"`
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		} `json:"object"`
	} `json:"data"`
}

// Response is the body of the 200.
type Response struct {
	Received    bool   `json:"received"`
	EventID     string `json:"event_id"`
	LedgerEntry *int64 `json:"ledger_entry"` // null for events that book nothing
}

// Receiver books events into the ledger, one idem flow per event.
type Receiver struct {
	prefix string
	flow   *idem.Flow[Event]
	// fault, when set, is called at the end of each phase, before its
	// commit (the serve command's --stall-phase).
	fault func(ctx context.Context, phase string, ev Event)
}

// NewReceiver returns a receiver whose tables live in schema (empty: the
// search_path). Apply Migrate first. fault, when not nil, runs at the end of
// each phase, before its commit: the tests stall a process there and kill it.
func NewReceiver(schema string, fault func(ctx context.Context, phase string, ev Event)) (*Receiver, error) {
	prefix, err := migrations.QualifiedPrefix(schema)
	if err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	r := &Receiver{prefix: prefix, fault: fault}
	r.flow, err = idem.NewFlow(FlowName, []idem.Phase[Event]{
		{Name: PhaseEventRecorded, Do: r.recordEvent},
		{Name: PhaseLedgerBooked, Do: r.book},
		{Name: PhaseResponded, Do: r.respond},
	}, &idem.FlowConfig[Event]{Retention: Retention})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Flow returns the flow, to register in the runner's Config.Flows.
func (r *Receiver) Flow() *idem.Flow[Event] { return r.flow }

// Handler returns the webhook receiver for the flow on runner: the key is
// the event's id, scoped to "webhook:stripe" and its Connect account, and verifier
// checks every delivery before anything is stored.
func (r *Receiver) Handler(runner *idem.Runner, verifier *Verifier) (*idemhttp.Webhook[Event], error) {
	return idemhttp.NewWebhook(runner, r.flow, &idemhttp.WebhookConfig{
		Provider: "stripe",
		Account:  idemhttp.Optional(idemhttp.JSONValue("account"), ""),
		EventID:  idemhttp.JSONValue("id"),
		Verify:   verifier.Verify,
		Content:  Content,
	})
}

// Content is the receiver's WebhookConfig.Content: the body without
// pending_webhooks, which Stripe updates between deliveries of an event.
func Content(_ *http.Request, body []byte) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, err
	}
	delete(members, "pending_webhooks")
	return json.Marshal(members)
}

// Migrate applies idem's migrations and creates the example's tables in
// schema (empty: the search_path), which must exist.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	m, err := migrations.New(pool, &migrations.Config{Schema: schema})
	if err != nil {
		return fmt.Errorf("webhooks: migrate: %w", err)
	}
	if _, err := m.Up(ctx); err != nil {
		return fmt.Errorf("webhooks: migrate: %w", err)
	}
	prefix, err := migrations.QualifiedPrefix(schema)
	if err != nil {
		return fmt.Errorf("webhooks: migrate: %w", err)
	}
	// Neither table has a unique constraint on the event id: nothing but
	// the phases keeps an event to one row, which is what the tests check.
	_, err = pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS `+prefix+`webhook_events (
			id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			idempotency_key_id bigint      REFERENCES `+prefix+`idem_keys (id) ON DELETE SET NULL,
			event_id           text        NOT NULL,
			account            text        NOT NULL,
			type               text        NOT NULL,
			received_at        timestamptz NOT NULL DEFAULT now()
		);
		CREATE TABLE IF NOT EXISTS `+prefix+`ledger (
			id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			idempotency_key_id bigint      REFERENCES `+prefix+`idem_keys (id) ON DELETE SET NULL,
			event_id           text        NOT NULL,
			account            text        NOT NULL,
			payment            text        NOT NULL,
			amount             bigint      NOT NULL,
			currency           text        NOT NULL,
			booked_at          timestamptz NOT NULL DEFAULT now()
		)`)
	if err != nil {
		return fmt.Errorf("webhooks: migrate: create tables: %w", err)
	}
	return nil
}

func (r *Receiver) recordEvent(ctx context.Context, tx idem.Tx, run *idem.Attempt[Event]) (idem.Result, error) {
	ev := run.Input()
	_, err := tx.Exec(ctx, `INSERT INTO `+r.prefix+`webhook_events (idempotency_key_id, event_id, account, type)
		VALUES ($1, $2, $3, $4)`, run.Key().ID, ev.ID, ev.Account, ev.Type)
	if err != nil {
		return idem.Result{}, fmt.Errorf("webhooks: record event: %w", err)
	}
	r.stall(ctx, PhaseEventRecorded, ev)
	return idem.Advance(), nil
}

// book is the write that must happen once per event: a payment is
// credited, a refund debited. Other event types book nothing.
func (r *Receiver) book(ctx context.Context, tx idem.Tx, run *idem.Attempt[Event]) (idem.Result, error) {
	ev := run.Input()
	amount := ev.Data.Object.Amount
	switch ev.Type {
	case "payment_intent.succeeded":
	case "charge.refunded":
		amount = -amount
	default:
		r.stall(ctx, PhaseLedgerBooked, ev)
		return idem.Advance(), nil
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO `+r.prefix+`ledger (idempotency_key_id, event_id, account, payment, amount, currency)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
		run.Key().ID, ev.ID, ev.Account, ev.Data.Object.ID, amount, ev.Data.Object.Currency).Scan(&id)
	if err != nil {
		return idem.Result{}, fmt.Errorf("webhooks: book: %w", err)
	}
	r.stall(ctx, PhaseLedgerBooked, ev)
	return idem.Advance(), run.SetCheckpoint("ledger_entry", id)
}

func (r *Receiver) respond(ctx context.Context, _ idem.Tx, run *idem.Attempt[Event]) (idem.Result, error) {
	resp := Response{Received: true, EventID: run.Input().ID}
	var id int64
	found, err := run.Checkpoint("ledger_entry", &id)
	if err != nil {
		return idem.Result{}, err
	}
	if found {
		resp.LedgerEntry = &id
	}
	r.stall(ctx, PhaseResponded, run.Input())
	return idem.RespondJSON(http.StatusOK, resp), nil
}

func (r *Receiver) stall(ctx context.Context, phase string, ev Event) {
	if r.fault != nil {
		r.fault(ctx, phase, ev)
	}
}

// SignatureHeader is the header Stripe signs its deliveries with.
const SignatureHeader = "Stripe-Signature"

// ToleranceDefault is how far a signature's timestamp may be from now, as
// Stripe's libraries default it.
const ToleranceDefault = 5 * time.Minute

// Sign returns the Stripe-Signature value of body sent at t:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed with
// secret>". It is what a provider computes; the tests' sender uses it.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verifier checks Stripe-Signature headers.
type Verifier struct {
	// Secrets are the endpoint's signing secrets; a signature by any of
	// them is accepted, so a secret can be rolled without downtime.
	Secrets []string
	// Tolerance is how far the signed timestamp may be from now, against
	// the replay of a captured delivery. Default ToleranceDefault.
	Tolerance time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Verify is an idemhttp.WebhookConfig.Verify: it accepts a delivery whose
// Stripe-Signature carries a v1 signature of its timestamp and body by one
// of the secrets, with a timestamp within the tolerance. MACs are compared
// in constant time.
func (v *Verifier) Verify(r *http.Request, body []byte) error {
	header := r.Header.Get(SignatureHeader)
	if header == "" {
		return errors.New("no " + SignatureHeader + " header")
	}
	var ts string
	var sigs [][]byte
	for item := range strings.SplitSeq(header, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(item), "=")
		switch k {
		case "t":
			ts = val
		case "v1":
			if sig, err := hex.DecodeString(val); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%s has no timestamp", SignatureHeader)
	}
	if len(sigs) == 0 {
		return fmt.Errorf("%s has no v1 signature", SignatureHeader)
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	tolerance := v.Tolerance
	if tolerance <= 0 {
		tolerance = ToleranceDefault
	}
	if age := now().Sub(time.Unix(sec, 0)); age > tolerance || age < -tolerance {
		return fmt.Errorf("the signature's timestamp is %s away from now, outside the tolerance of %s", age.Round(time.Second), tolerance)
	}
	for _, secret := range v.Secrets {
		want := mac(secret, ts, body)
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				return nil
			}
		}
	}
	return errors.New("no signature matches the body")
}
