package ridesapp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/rides/fakepay"
)

// FlowName is the rides flow's name, stored with every key it creates.
const FlowName = "rides.create"

// The phases of the rides flow, in order. The first two are also the
// recovery points a key passes through: started -> ride_created ->
// charge_created -> finished. The last phase responds, so its name is never
// recorded.
const (
	PhaseRideCreated     = "ride_created"
	PhaseChargeCreated   = "charge_created"
	PhaseReceiptEnqueued = "receipt_enqueued"
)

// Every ride costs the same, as in rocket-rides-atomic's prototype pricing.
const (
	RideAmount   int64 = 20_00
	RideCurrency       = "usd"
)

// ErrPaymentsUnavailable is wrapped by the error of a charge phase whose
// call to the provider failed without an answer to store: a 5xx, a timeout,
// a dropped connection. The phase rolls back and the retry asks again.
var ErrPaymentsUnavailable = errors.New("rides: payment provider unavailable")

// AuditActionRideCreated is the audit record written with every new ride.
const AuditActionRideCreated = "ride.created"

// RideParams is the input of POST /rides. The coordinates come from the
// JSON body; pointers tell a missing field from a zero. UserID comes from
// authentication, never from the body: the HTTP layer overwrites whatever a
// client sends. It is part of the input (and so of the fingerprint) because
// a request completed server-side has nothing else to go on.
type RideParams struct {
	UserID    int64    `json:"user_id"`
	OriginLat *float64 `json:"origin_lat"`
	OriginLon *float64 `json:"origin_lon"`
	TargetLat *float64 `json:"target_lat"`
	TargetLon *float64 `json:"target_lon"`
}

// FieldProblem is one invalid field of a ride request: the field's JSON
// name and what is wrong with it, phrased to follow the name ("origin_lat
// is required").
type FieldProblem struct {
	Field  string
	Detail string
}

// Validate reports every invalid coordinate, in field order: missing, or
// outside [-90, 90] for latitudes and [-180, 180] for longitudes. (A value
// that is not a number never gets here: decoding refuses it.)
func (p *RideParams) Validate() []FieldProblem {
	var problems []FieldProblem
	check := func(field string, v *float64, limit float64, kind string) {
		switch {
		case v == nil:
			problems = append(problems, FieldProblem{field, "is required"})
		case math.IsNaN(*v) || *v < -limit || *v > limit:
			problems = append(problems, FieldProblem{field, fmt.Sprintf("must be a valid %s, between %g and %g", kind, -limit, limit)})
		}
	}
	check("origin_lat", p.OriginLat, 90, "latitude")
	check("origin_lon", p.OriginLon, 180, "longitude")
	check("target_lat", p.TargetLat, 90, "latitude")
	check("target_lon", p.TargetLon, 180, "longitude")
	return problems
}

// RideResponse is the body of a 201.
type RideResponse struct {
	Message  string `json:"message"`
	RideID   int64  `json:"ride_id"`
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// MessageRideCreated is RideResponse.Message.
const MessageRideCreated = "Payment accepted. Your pilot is on their way!"

// Payments is what the flow needs from the payment provider.
// *fakepay.Client implements it.
type Payments interface {
	CreateCharge(ctx context.Context, idempotencyKey string, p fakepay.ChargeParams) (*fakepay.Charge, error)
}

var _ Payments = (*fakepay.Client)(nil)

// newFlow declares the rides flow on a's database, provider and queue.
func (a *App) newFlow() (*idem.Flow[RideParams], error) {
	return idem.NewFlow(FlowName, []idem.Phase[RideParams]{
		{Name: PhaseRideCreated, Do: a.createRide},
		{Name: PhaseChargeCreated, Do: a.chargeRide},
		{Name: PhaseReceiptEnqueued, Do: a.enqueueReceipt},
	}, nil)
}

// createRide inserts the ride and its audit record. Both commit with the
// recovery point ride_created, or neither does.
func (a *App) createRide(ctx context.Context, tx idem.Tx, run *idem.Attempt[RideParams]) (idem.Result, error) {
	in := run.Input()
	if problems := in.Validate(); len(problems) > 0 {
		// The HTTP layer validates first; this guards input that reached the
		// flow another way (a stored key from an older release, a test).
		return idem.Result{}, fmt.Errorf("rides: invalid input: %s %s", problems[0].Field, problems[0].Detail)
	}
	// The charge's reference is the charge phase's downstream key: derived
	// from the request, it is the same for every ride this request ever
	// creates (see ChargeDescription).
	var rideID int64
	err := tx.QueryRow(ctx, `INSERT INTO `+a.prefix+`rides
		(idempotency_key_id, user_id, origin_lat, origin_lon, target_lat, target_lon, charge_reference`+a.scopeColumn()+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7`+a.scopeValue(8)+`) RETURNING id`,
		a.scoped(run, run.Key().ID, in.UserID, *in.OriginLat, *in.OriginLon, *in.TargetLat, *in.TargetLon,
			run.Key().DownstreamKey(PhaseChargeCreated))...).Scan(&rideID)
	if err != nil {
		return idem.Result{}, fmt.Errorf("rides: insert ride: %w", err)
	}
	// The audit data is the request as the client sent it; the user, which
	// came from authentication, has a column of its own.
	data, err := json.Marshal(auditRideData{
		OriginLat: *in.OriginLat, OriginLon: *in.OriginLon, TargetLat: *in.TargetLat, TargetLon: *in.TargetLon,
	})
	if err != nil {
		return idem.Result{}, fmt.Errorf("rides: encode audit data: %w", err)
	}
	var originIP *string
	if ip := OriginIP(ctx); ip != "" {
		originIP = &ip
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+a.prefix+`audit_records
		(action, data, origin_ip, resource_id, resource_type, user_id`+a.scopeColumn()+`)
		VALUES ($1, $2::jsonb, $3::inet, $4, 'ride', $5`+a.scopeValue(6)+`)`,
		a.scoped(run, AuditActionRideCreated, string(data), originIP, rideID, in.UserID)...)
	if err != nil {
		return idem.Result{}, fmt.Errorf("rides: insert audit record: %w", err)
	}
	return idem.Advance(), nil
}

type auditRideData struct {
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	TargetLat float64 `json:"target_lat"`
	TargetLon float64 `json:"target_lon"`
}

// rideOfKey is the ride a request created, found through its key as
// rocket-rides-atomic does, so a resumed request needs nothing but the key.
type rideOfKey struct {
	ID              int64
	UserID          int64
	Email           string
	CustomerID      string
	ChargeID        *string
	ChargeReference *string
}

func (a *App) loadRide(ctx context.Context, tx idem.Tx, run *idem.Attempt[RideParams]) (*rideOfKey, error) {
	keyID, phase := run.Key().ID, run.Phase()
	var r rideOfKey
	err := tx.QueryRow(ctx, `SELECT r.id, r.user_id, u.email, u.customer_id, r.charge_id, r.charge_reference
		FROM `+a.prefix+`rides r JOIN `+a.prefix+`users u ON u.id = r.user_id
		WHERE r.idempotency_key_id = $1`+a.scopeCondition("r.", 2), a.scoped(run, keyID)...).Scan(&r.ID, &r.UserID, &r.Email, &r.CustomerID, &r.ChargeID, &r.ChargeReference)
	if errors.Is(err, pgx.ErrNoRows) {
		// ride_created committed the ride with the recovery point, so this is
		// a bug (or a hand-edited key), not a condition to retry.
		return nil, fmt.Errorf("rides: bug: key %d is past ride_created but has no ride (phase %s)", keyID, phase)
	}
	if err != nil {
		return nil, fmt.Errorf("rides: load ride: %w", err)
	}
	return &r, nil
}

// chargeRide charges the ride through the payment provider, with the
// phase's downstream idempotency key, and records the charge on the ride.
//
// The call is made inside the phase's transaction, as in rocket-rides-atomic:
// if anything fails after the provider charged (the response is lost, the
// process dies, the commit fails), the phase runs again with the same
// downstream key and the provider returns the original charge instead of
// making a second one.
//
// Everything the call sends is derived from the request, never from a row
// this request created: the downstream key (idem derives it) and the
// description (the ride's charge reference, the same key). A failover to a
// standby that had not received the ride loses the ride and the key, and the
// retry creates a new ride with another id; a description naming that id
// would differ from the first attempt's, and a provider that compares the
// parameters sent under a key (Stripe does; so does fakepay) would refuse the
// retry instead of returning the first charge.
func (a *App) chargeRide(ctx context.Context, tx idem.Tx, run *idem.Attempt[RideParams]) (idem.Result, error) {
	ride, err := a.loadRide(ctx, tx, run)
	if err != nil {
		return idem.Result{}, err
	}
	var charge *fakepay.Charge
	err = run.Foreign(ctx, "charge", func(ctx context.Context, downstreamKey string) error {
		ctx, cancel := context.WithTimeout(ctx, a.paymentsTimeout)
		defer cancel()
		reference := downstreamKey // a ride from before charge_reference existed
		if ride.ChargeReference != nil {
			reference = *ride.ChargeReference
		}
		var err error
		charge, err = a.payments.CreateCharge(ctx, downstreamKey, fakepay.ChargeParams{
			Amount:      RideAmount,
			Currency:    RideCurrency,
			Customer:    ride.CustomerID,
			Description: ChargeDescription(reference),
		})
		return err
	})

	var cardErr *fakepay.CardError
	switch {
	case errors.As(err, &cardErr):
		// A decline is an answer, not a failure: store it, so every retry
		// gets the same 402 and nobody is charged.
		if err := a.setPaymentStatus(ctx, tx, run, ride.ID, "declined"); err != nil {
			return idem.Result{}, err
		}
		return respondProblem(http.StatusPaymentRequired, ProblemCardDeclined, "Card declined",
			"Error from payment processor: "+cardErr.Message, ride.ID), nil
	case err != nil && fakepay.IsPermanent(err):
		// The provider refused the request itself; retrying cannot help.
		a.logger.ErrorContext(ctx, "rides: payment provider rejected the charge", "ride_id", ride.ID, "err", err)
		if err := a.setPaymentStatus(ctx, tx, run, ride.ID, "failed"); err != nil {
			return idem.Result{}, err
		}
		return respondProblem(http.StatusBadGateway, ProblemPaymentFailed, "Payment failed",
			"Error from payment processor. Please contact support.", ride.ID), nil
	case err != nil:
		// Transient or unknown (a 5xx, a dropped connection): fail the phase.
		// Nothing is stored; the retry runs this phase again with the same
		// downstream key.
		return idem.Result{}, fmt.Errorf("%w: charge for ride %d: %w", ErrPaymentsUnavailable, ride.ID, err)
	}

	_, err = tx.Exec(ctx, `UPDATE `+a.prefix+`rides SET charge_id = $1, payment_status = 'charged' WHERE id = $2`+a.scopeCondition("", 3),
		a.scoped(run, charge.ID, ride.ID)...)
	if err != nil {
		return idem.Result{}, fmt.Errorf("rides: record charge %s on ride %d: %w", charge.ID, ride.ID, err)
	}
	return idem.Advance(), nil
}

func (a *App) setPaymentStatus(ctx context.Context, tx idem.Tx, run *idem.Attempt[RideParams], rideID int64, status string) error {
	if _, err := tx.Exec(ctx, `UPDATE `+a.prefix+`rides SET payment_status = $1 WHERE id = $2`+a.scopeCondition("", 3),
		a.scoped(run, status, rideID)...); err != nil {
		return fmt.Errorf("rides: mark ride %d %s: %w", rideID, status, err)
	}
	return nil
}

// ChargeDescription is the description of a ride's charge at the provider:
// it names the ride's charge reference (rides.charge_reference), which the
// audit reads back (see ParseChargeDescription) to tie the ledger to the
// rides. The reference is derived from the request, not from the ride's id,
// so that every attempt of a request sends the same charge.
func ChargeDescription(reference string) string { return chargeDescriptionPrefix + reference }

const chargeDescriptionPrefix = "Charge for ride request "

// ParseChargeDescription returns the charge reference a charge description
// names.
func ParseChargeDescription(description string) (string, bool) {
	reference, ok := strings.CutPrefix(description, chargeDescriptionPrefix)
	if !ok || reference == "" || strings.ContainsAny(reference, " \t\r\n") {
		return "", false
	}
	return reference, true
}

// enqueueReceipt queues the receipt email with a transactional insert: the
// job commits with the phase and the stored 201, or rolls back with them, so
// a receipt is queued exactly once per ride and never for a ride whose
// request did not finish.
func (a *App) enqueueReceipt(ctx context.Context, tx idem.Tx, run *idem.Attempt[RideParams]) (idem.Result, error) {
	ride, err := a.loadRide(ctx, tx, run)
	if err != nil {
		return idem.Result{}, err
	}
	if ride.ChargeID == nil {
		return idem.Result{}, fmt.Errorf("rides: bug: ride %d is past charge_created without a charge", ride.ID)
	}
	// River's InsertTx takes a pgx.Tx: PgxTx is the phase's transaction with
	// Commit and Rollback disarmed, so the job commits with the phase.
	_, err = a.river.InsertTx(ctx, run.PgxTx(), ReceiptArgs{
		RideID:   ride.ID,
		UserID:   ride.UserID,
		Email:    ride.Email,
		ChargeID: *ride.ChargeID,
		Amount:   RideAmount,
		Currency: RideCurrency,
	}, nil)
	if err != nil {
		return idem.Result{}, fmt.Errorf("rides: enqueue receipt for ride %d: %w", ride.ID, err)
	}
	return idem.RespondJSON(http.StatusCreated, RideResponse{
		Message:  MessageRideCreated,
		RideID:   ride.ID,
		ChargeID: *ride.ChargeID,
		Amount:   RideAmount,
		Currency: RideCurrency,
	}), nil
}

// On Citus (App.citus) the flow's statements name the key's scope, the
// distribution column of rides and audit_records; on plain PostgreSQL they
// are as they always were. scopeColumn and scopeValue extend an INSERT's
// column and value lists, scopeCondition a WHERE, with parameter $n, and
// scoped appends the scope to the arguments.
func (a *App) scopeColumn() string {
	if a.citus {
		return ", scope"
	}
	return ""
}

func (a *App) scopeValue(n int) string {
	if a.citus {
		return fmt.Sprintf(", $%d", n)
	}
	return ""
}

func (a *App) scopeCondition(alias string, n int) string {
	if a.citus {
		return fmt.Sprintf(" AND %sscope = $%d", alias, n)
	}
	return ""
}

func (a *App) scoped(run *idem.Attempt[RideParams], args ...any) []any {
	if a.citus {
		return append(args, run.Key().Scope)
	}
	return args
}
