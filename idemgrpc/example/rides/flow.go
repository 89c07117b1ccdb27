package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/example/rides/ridespb"
)

// The booking flow: rocket-rides-atomic's three atomic phases, answering in
// protobuf. Each phase commits its writes together with the key's recovery
// point:
//
//	started --ride_created--> ride_created --charge_created--> charge_created --receipt_recorded--> finished
const (
	flowName            = "rides.v1.create_ride"
	phaseRideCreated    = "ride_created"
	phaseChargeCreated  = "charge_created"
	phaseReceiptCreated = "receipt_recorded"
)

// Every ride costs the same, as in rocket-rides-atomic.
const (
	rideAmount   int64 = 20_00
	rideCurrency       = "usd"
	rideMessage        = "Payment accepted. Your pilot is on their way!"
)

// Domain and reason of the ErrorInfo of a declined card.
const (
	errorDomain        = "rides.example"
	reasonCardDeclined = "CARD_DECLINED"
)

// rideInput is the flow's input: the call (method and request) and the
// rider, who comes from authentication and never from the request. The
// rider is part of the input because a request completed server-side has
// nothing else to go on.
type rideInput struct {
	Call   idemgrpc.Input[*ridespb.CreateRideRequest] `json:"call"`
	UserID int64                                      `json:"user_id"`
}

// phaseTx is what a phase writes with: only Exec and QueryRow are used.
type phaseTx = idem.Tx

// crashAfterChargeEnv names the environment variable that makes a server
// stop dead between the charge and its commit, to show (and test) that the
// retry charges once: "hang" announces it on stdout and waits to be killed,
// "kill" kills the process itself with SIGKILL.
const crashAfterChargeEnv = "RIDES_CRASH_AFTER_CHARGE"

func (s *server) flow() *idem.Flow[rideInput] {
	return idem.MustNewFlow(flowName, []idem.Phase[rideInput]{
		{Name: phaseRideCreated, Do: s.createRide},
		{Name: phaseChargeCreated, Do: s.chargeRide},
		{Name: phaseReceiptCreated, Do: s.recordReceipt},
	}, nil)
}

// createRide inserts the ride.
func (s *server) createRide(ctx context.Context, tx phaseTx, a *idem.Attempt[rideInput]) (idem.Result, error) {
	in := a.Input()
	req := in.Call.Message
	_, err := tx.Exec(ctx, `INSERT INTO rides (idempotency_key_id, user_id, origin_lat, origin_lon, target_lat, target_lon)
		VALUES ($1, $2, $3, $4, $5, $6)`,
		a.Key().ID, in.UserID, req.GetOrigin().GetLat(), req.GetOrigin().GetLon(), req.GetTarget().GetLat(), req.GetTarget().GetLon())
	if err != nil {
		return idem.Result{}, fmt.Errorf("rides: insert ride: %w", err)
	}
	return idem.Advance(), nil
}

type rideOfKey struct {
	id                int64
	email, customerID string
	chargeID          *string
}

// loadRide finds the ride a request created, through its key, so a resumed
// request needs nothing but the key.
func loadRide(ctx context.Context, tx phaseTx, keyID int64) (*rideOfKey, error) {
	var r rideOfKey
	err := tx.QueryRow(ctx, `SELECT r.id, u.email, u.customer_id, r.charge_id
		FROM rides r JOIN users u ON u.id = r.user_id WHERE r.idempotency_key_id = $1`, keyID).
		Scan(&r.id, &r.email, &r.customerID, &r.chargeID)
	if err != nil {
		return nil, fmt.Errorf("rides: load the ride of key %d: %w", keyID, err)
	}
	return &r, nil
}

// chargeRide charges the ride at the provider with the phase's downstream
// idempotency key. If the process dies after the provider charged and before
// this phase commits, the retry runs the phase again with the same key, and
// the provider answers with the original charge.
func (s *server) chargeRide(ctx context.Context, tx phaseTx, a *idem.Attempt[rideInput]) (idem.Result, error) {
	ride, err := loadRide(ctx, tx, a.Key().ID)
	if err != nil {
		return idem.Result{}, err
	}
	var ch *charge
	err = a.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
		var err error
		ch, err = s.pay.createCharge(ctx, key, chargeParams{
			Amount: rideAmount, Currency: rideCurrency, Customer: ride.customerID,
			Description: fmt.Sprintf("Charge for ride %d", ride.id),
		})
		return err
	})
	switch {
	case errors.Is(err, errCardDeclined):
		// A decline is an answer, not a failure: stored, and replayed to
		// every retry.
		if _, err := tx.Exec(ctx, `UPDATE rides SET payment_status = 'declined' WHERE id = $1`, ride.id); err != nil {
			return idem.Result{}, err
		}
		st, err := status.New(codes.FailedPrecondition, "Your card was declined.").WithDetails(
			&errdetails.ErrorInfo{Reason: reasonCardDeclined, Domain: errorDomain,
				Metadata: map[string]string{"ride_id": fmt.Sprint(ride.id)}})
		if err != nil {
			return idem.Result{}, err
		}
		return idemgrpc.RespondStatus(st)
	case err != nil:
		// Unknown outcome: fail the phase, store nothing; the retry asks
		// the provider again with the same key.
		return idem.Result{}, fmt.Errorf("rides: charge ride %d: %w", ride.id, err)
	}

	switch os.Getenv(crashAfterChargeEnv) {
	case "hang":
		fmt.Fprintf(s.stdout, "crash point: ride %d charged as %s, not committed; waiting to be killed\n", ride.id, ch.ID)
		<-make(chan struct{})
	case "kill":
		fmt.Fprintf(s.stdout, "crash point: ride %d charged as %s, not committed; killing myself\n", ride.id, ch.ID)
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Kill()
		}
		<-make(chan struct{})
	}

	if _, err := tx.Exec(ctx, `UPDATE rides SET charge_id = $1, payment_status = 'charged' WHERE id = $2`, ch.ID, ride.id); err != nil {
		return idem.Result{}, fmt.Errorf("rides: record charge %s on ride %d: %w", ch.ID, ride.id, err)
	}
	return idem.Advance(), nil
}

// recordReceipt records the receipt and answers with the ride.
func (s *server) recordReceipt(ctx context.Context, tx phaseTx, a *idem.Attempt[rideInput]) (idem.Result, error) {
	ride, err := loadRide(ctx, tx, a.Key().ID)
	if err != nil {
		return idem.Result{}, err
	}
	if ride.chargeID == nil {
		return idem.Result{}, fmt.Errorf("rides: bug: ride %d is past %s without a charge", ride.id, phaseChargeCreated)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO receipts (ride_id, email, charge_id, amount) VALUES ($1, $2, $3, $4)`,
		ride.id, ride.email, *ride.chargeID, rideAmount); err != nil {
		return idem.Result{}, fmt.Errorf("rides: record receipt of ride %d: %w", ride.id, err)
	}
	return idemgrpc.Respond(&ridespb.Ride{
		RideId: ride.id, ChargeId: *ride.chargeID, Amount: rideAmount, Currency: rideCurrency, Message: rideMessage,
	})
}
