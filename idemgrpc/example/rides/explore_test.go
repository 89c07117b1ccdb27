package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/example/rides/ridespb"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

// The booking flow at every crash point idemtest knows (the worker dying
// before or after each commit and right after the charge, a lost commit
// acknowledgement, a serialization failure, a lease takeover mid-phase):
// each scenario must end with the uninterrupted run's answer, one ride, one
// receipt and one charge in the ledger for its key.
func TestFlowAtEveryCrashPoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		email, payment string
	}{
		{"user@example.com", "charged"},
		{"user-bad-source@example.com", "declined"},
	} {
		t.Run(tc.payment, func(t *testing.T) {
			t.Parallel()
			schema := pgtest.NewSchema(t)
			require.NoError(t, migrate(t.Context(), schema.Pool))
			riders, err := loadRiders(t.Context(), schema.Pool)
			require.NoError(t, err)
			pay := newPayments(0)
			paySrv := httptest.NewServer(pay)
			t.Cleanup(paySrv.Close)
			s := &server{pool: schema.Pool, pay: &payClient{baseURL: paySrv.URL, http: &http.Client{Timeout: 10 * time.Second}},
				riders: riders, stdout: io.Discard, log: slog.New(slog.DiscardHandler)}
			rider := riders[tc.email]

			rep := idemtest.Explore(t, idemtest.Config[rideInput]{
				Pool: schema.Pool,
				Flow: s.flow(),
				Input: rideInput{
					Call: idemgrpc.Input[*ridespb.CreateRideRequest]{Method: ridespb.Rides_CreateRide_FullMethodName, Message: &ridespb.CreateRideRequest{
						Origin: &ridespb.Point{Lat: 37.7749, Lon: -122.4194}, Target: &ridespb.Point{Lat: 37.8044, Lon: -122.2712},
					}},
					UserID: rider.id,
				},
				Scope:   fmt.Sprintf("user:%d", rider.id),
				Path:    ridespb.Rides_CreateRide_FullMethodName,
				Compare: sameRideAnswer,
				Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
					return checkOneRide(ctx, s, pay, key, tc.payment)
				},
			})
			t.Logf("%s: %d crash scenarios explored", tc.payment, len(rep.Scenarios))
		})
	}
}

// sameRideAnswer compares two stored answers as the client sees them: the
// same status, and for a ride the same message but for its ids, which are
// each scenario's own.
func sameRideAnswer(baseline, got *idemtype.Response) error {
	if baseline.Status != got.Status || baseline.Header.Get("Content-Type") != got.Header.Get("Content-Type") {
		return fmt.Errorf("answer %d %s, want %d %s", got.Status, got.Header.Get("Content-Type"), baseline.Status, baseline.Header.Get("Content-Type"))
	}
	if baseline.Status != http.StatusOK {
		return nil // a stored status; its ErrorInfo names the scenario's ride
	}
	var want, have ridespb.Ride
	if err := proto.Unmarshal(baseline.Body, &want); err != nil {
		return err
	}
	if err := proto.Unmarshal(got.Body, &have); err != nil {
		return err
	}
	want.RideId, want.ChargeId, have.RideId, have.ChargeId = 0, "", 0, ""
	if !proto.Equal(&want, &have) {
		return fmt.Errorf("ride %v, want %v", &have, &want)
	}
	return nil
}

// checkOneRide is the invariant of one finished key: one ride in the
// expected payment status; if charged, one charge in the ledger for it and
// one receipt; if declined, neither.
func checkOneRide(ctx context.Context, s *server, pay *payments, key *idemtype.KeyRecord, want string) error {
	var rideID int64
	var status string
	var chargeID *string
	if err := s.pool.QueryRow(ctx, `SELECT id, payment_status, charge_id FROM rides WHERE idempotency_key_id = $1`, key.ID).
		Scan(&rideID, &status, &chargeID); err != nil {
		return fmt.Errorf("the key's ride: %w", err)
	}
	if status != want {
		return fmt.Errorf("ride %d is %s, want %s", rideID, status, want)
	}
	var charges []string
	for _, c := range pay.charges() {
		if c.Description == fmt.Sprintf("Charge for ride %d", rideID) {
			charges = append(charges, c.ID)
		}
	}
	var receipts int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM receipts WHERE ride_id = $1`, rideID).Scan(&receipts); err != nil {
		return err
	}
	switch {
	case want == "charged" && (len(charges) != 1 || chargeID == nil || *chargeID != charges[0] || receipts != 1):
		return fmt.Errorf("ride %d: charges %v, charge_id %v, %d receipts; want one charge, recorded, and one receipt", rideID, charges, chargeID, receipts)
	case want == "declined" && (len(charges) != 0 || receipts != 0):
		return fmt.Errorf("declined ride %d: charges %v, %d receipts", rideID, charges, receipts)
	}
	return nil
}
