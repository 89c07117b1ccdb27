// Package sms is idem's example of a foreign call that cannot be
// deduplicated downstream: sending a text message through a gateway that
// has no idempotency keys.
//
// A payment provider that deduplicates on a key (the rides example) makes a
// crash harmless: the interrupted phase runs again with the same key and
// the provider returns the first charge. An SMS gateway without keys sends
// a second message every time it is asked. So the send phase declares
// idem.ForeignNotIdempotent: the runner records the attempt durably before
// the call, and a request that finds the record without the phase committed
// is never re-sent blindly. It goes to needs_reconcile, and the phase's
// reconcile hook asks the gateway what it sent under our reference:
//
//   - found: done. The hook records the message, as the phase would have,
//     and the flow goes on to respond.
//   - nothing: not done. The phase runs again, which is now safe.
//   - the gateway cannot tell: unknown. The key waits for a later reconcile
//     run or an operator; clients get a "needs reconcile" answer, never a
//     second message.
//
// The flow has three phases:
//
//	message_saved  validate, insert the message row (pending)           -> 422 if invalid
//	sent           send through the gateway, mark the row sent          -> 422 if the gateway refuses
//	responded      201 {"message_id", "gateway_id", "status": "sent"}
//
// The tests (sms_test.go) explore every crash point with package idemtest
// and walk through each reconcile verdict.
package sms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/migrations"
)

// FlowName is the flow's name, stored with every key.
const FlowName = "sms.send"

// The flow's phases, in order.
const (
	PhaseMessageSaved = "message_saved"
	PhaseSent         = "sent"
	PhaseResponded    = "responded"
)

// MaxBodyLength is the longest message accepted, in characters.
const MaxBodyLength = 1600

// Params is the input of a send request.
type Params struct {
	To   string `json:"to"`
	Text string `json:"text"`
}

// Response is the body of a 201.
type Response struct {
	MessageID int64  `json:"message_id"`
	GatewayID string `json:"gateway_id"`
	Status    string `json:"status"`
}

// Problem is the body of a 422: an RFC 9457 problem whose type is one of
// the Problem constants.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// Problem types, documented in the README.
const (
	ProblemInvalidNumber = "https://github.com/go-idem/idem/blob/main/examples/sms/README.md#invalid-number"
	ProblemInvalidText   = "https://github.com/go-idem/idem/blob/main/examples/sms/README.md#invalid-text"
	ProblemRejected      = "https://github.com/go-idem/idem/blob/main/examples/sms/README.md#rejected"
)

var e164 = regexp.MustCompile(`^\+[1-9][0-9]{6,14}$`)

// Sender sends text messages through a gateway, one idem flow per request.
type Sender struct {
	gateway Gateway
	prefix  string
	flow    *idem.Flow[Params]
}

// NewSender returns a sender on gateway whose tables live in schema (empty:
// the search_path). Apply Migrate first.
func NewSender(gateway Gateway, schema string) (*Sender, error) {
	if gateway == nil {
		return nil, errors.New("sms: NewSender needs a gateway")
	}
	prefix, err := migrations.QualifiedPrefix(schema)
	if err != nil {
		return nil, fmt.Errorf("sms: %w", err)
	}
	s := &Sender{gateway: gateway, prefix: prefix}
	s.flow, err = idem.NewFlow(FlowName, []idem.Phase[Params]{
		{Name: PhaseMessageSaved, Do: s.saveMessage},
		{Name: PhaseSent, Do: s.send, Foreign: idem.ForeignNotIdempotent, Reconcile: s.reconcileSend},
		{Name: PhaseResponded, Do: s.respond},
	}, nil)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Flow returns the flow, to run with an idem.Runner (and to register in its
// Config.Flows, so that reconcile runs can find it).
func (s *Sender) Flow() *idem.Flow[Params] { return s.flow }

// Migrate applies idem's migrations and creates the sms_messages table in
// schema (empty: the search_path), which must exist.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	m, err := migrations.New(pool, &migrations.Config{Schema: schema})
	if err != nil {
		return fmt.Errorf("sms: migrate: %w", err)
	}
	if _, err := m.Up(ctx); err != nil {
		return fmt.Errorf("sms: migrate: %w", err)
	}
	prefix, err := migrations.QualifiedPrefix(schema)
	if err != nil {
		return fmt.Errorf("sms: migrate: %w", err)
	}
	// One row per request: the unique key id is what lets a resumed request
	// find its message, and refuses a second one.
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+prefix+`sms_messages (
		id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		idempotency_key_id bigint      UNIQUE REFERENCES `+prefix+`idem_keys (id) ON DELETE SET NULL,
		to_number          text        NOT NULL,
		body               text        NOT NULL,
		status             text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'rejected')),
		gateway_id         text        UNIQUE,
		created_at         timestamptz NOT NULL DEFAULT now(),
		CONSTRAINT sms_messages_sent_has_gateway_id CHECK ((status = 'sent') = (gateway_id IS NOT NULL))
	)`)
	if err != nil {
		return fmt.Errorf("sms: migrate: create sms_messages: %w", err)
	}
	return nil
}

// Reference is what the flow sends as the gateway reference of a message
// row, and what the reconcile hook looks it up by.
func Reference(messageID int64) string { return fmt.Sprintf("msg-%d", messageID) }

func (s *Sender) saveMessage(ctx context.Context, tx idem.Tx, run *idem.Attempt[Params]) (idem.Result, error) {
	in := run.Input()
	switch n := utf8.RuneCountInString(in.Text); {
	case !e164.MatchString(in.To):
		return unprocessable(ProblemInvalidNumber, "to must be an E.164 number such as +15550100"), nil
	case n == 0 || n > MaxBodyLength:
		return unprocessable(ProblemInvalidText, fmt.Sprintf("text must be 1 to %d characters, not %d", MaxBodyLength, n)), nil
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO `+s.prefix+`sms_messages (idempotency_key_id, to_number, body)
		VALUES ($1, $2, $3) RETURNING id`, run.Key().ID, in.To, in.Text).Scan(&id)
	if err != nil {
		return idem.Result{}, fmt.Errorf("sms: insert message: %w", err)
	}
	return idem.Advance(), run.SetCheckpoint("message_id", id)
}

// send makes the not-idempotent call. The runner has recorded the attempt
// before the callback runs; if anything stops this phase from committing
// after that, the key goes to needs_reconcile rather than sending again.
func (s *Sender) send(ctx context.Context, tx idem.Tx, run *idem.Attempt[Params]) (idem.Result, error) {
	id, err := messageID(run)
	if err != nil {
		return idem.Result{}, err
	}
	in := run.Input()
	var msg *Message
	err = run.Foreign(ctx, "send_sms", func(ctx context.Context, _ string) error {
		// The downstream key is of no use to a gateway that ignores keys;
		// our reference is what lets the reconcile hook find the message.
		var err error
		msg, err = s.gateway.Send(ctx, Outgoing{To: in.To, Body: in.Text, Reference: Reference(id)})
		return err
	})
	var rejected *RejectedError
	if errors.As(err, &rejected) {
		// A definite refusal: nothing was sent, and the answer is final.
		if _, err := tx.Exec(ctx, `UPDATE `+s.prefix+`sms_messages SET status = 'rejected' WHERE id = $1`, id); err != nil {
			return idem.Result{}, fmt.Errorf("sms: mark message rejected: %w", err)
		}
		return unprocessable(ProblemRejected, rejected.Reason), nil
	}
	if err != nil {
		return idem.Result{}, fmt.Errorf("sms: send: %w", err)
	}
	return idem.Advance(), s.markSent(ctx, tx, run, id, msg.ID)
}

// reconcileSend asks the gateway what it sent under the message's reference.
// It runs in a transaction of its own, so "done" records the message exactly
// as send would have.
func (s *Sender) reconcileSend(ctx context.Context, tx idem.Tx, run *idem.Attempt[Params]) (idem.ReconcileVerdict, error) {
	id, err := messageID(run)
	if err != nil {
		return idem.ReconcileVerdict{}, err
	}
	sent, err := s.gateway.Lookup(ctx, Reference(id))
	switch {
	case err != nil:
		return idem.ReconcileUnknown(fmt.Sprintf("sms: gateway lookup of %s failed: %v", Reference(id), err)), nil
	case len(sent) == 0:
		return idem.ReconcileNotHappened(), nil
	}
	if err := s.markSent(ctx, tx, run, id, sent[0].ID); err != nil {
		return idem.ReconcileVerdict{}, err
	}
	return idem.ReconcileHappened(idem.Advance()), nil
}

func (s *Sender) markSent(ctx context.Context, tx idem.Tx, run *idem.Attempt[Params], id int64, gatewayID string) error {
	if _, err := tx.Exec(ctx, `UPDATE `+s.prefix+`sms_messages SET status = 'sent', gateway_id = $2 WHERE id = $1`, id, gatewayID); err != nil {
		return fmt.Errorf("sms: mark message sent: %w", err)
	}
	return run.SetCheckpoint("gateway_id", gatewayID)
}

func (s *Sender) respond(_ context.Context, _ idem.Tx, run *idem.Attempt[Params]) (idem.Result, error) {
	id, err := messageID(run)
	if err != nil {
		return idem.Result{}, err
	}
	var gatewayID string
	if _, err := run.Checkpoint("gateway_id", &gatewayID); err != nil {
		return idem.Result{}, err
	}
	return idem.RespondJSON(http.StatusCreated, Response{MessageID: id, GatewayID: gatewayID, Status: "sent"}), nil
}

func messageID(run *idem.Attempt[Params]) (int64, error) {
	var id int64
	ok, err := run.Checkpoint("message_id", &id)
	if err == nil && !ok {
		err = fmt.Errorf("sms: bug: phase %s found no message_id checkpoint", run.Phase())
	}
	return id, err
}

// unprocessable is a stored, final refusal: retries replay it.
func unprocessable(typ, detail string) idem.Result {
	// Strings and an int: Marshal cannot fail.
	body, _ := json.Marshal(Problem{Type: typ, Title: "The message cannot be sent", Status: http.StatusUnprocessableEntity, Detail: detail})
	return idem.Respond(http.StatusUnprocessableEntity, http.Header{"Content-Type": {"application/problem+json"}}, body)
}
