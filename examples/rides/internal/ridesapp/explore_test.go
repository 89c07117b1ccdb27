package ridesapp_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

func float(v float64) *float64 { return &v }

// The rides flow at every crash point (issue 6's kit): the worker dying
// before or after each commit and right after the charge, a lost commit
// acknowledgement, a serialization failure and a lease takeover mid-phase;
// and, through the fault proxy, each of the request's round trips to
// Postgres losing its reply, then stalling. Each scenario must end with the
// uninterrupted run's answer and exactly one ride, one audit record, one
// charge at the provider and one receipt job for its key.
func TestRidesFlowAtEveryCrashPoint(t *testing.T) {
	t.Parallel()
	ridesFlowAtEveryCrashPoint(t, setup(t, nil))
}

// The crash kit over the rides flow on Citus: idem's tables, rides and
// audit records distributed by the key's scope and co-located, so each
// phase's writes and its guarded commit run on the scope's worker (River's
// job table stays on the coordinator, in the same distributed transaction).
// The wire scenarios fault the link between the app and the coordinator.
func TestRidesFlowAtEveryCrashPointOnCitus(t *testing.T) {
	t.Parallel()
	ridesFlowAtEveryCrashPoint(t, setup(t, &options{citus: true}))
}

func ridesFlowAtEveryCrashPoint(t *testing.T, b *testBundle) {
	input := ridesapp.RideParams{UserID: b.goodUserID,
		OriginLat: float(37.7749), OriginLon: float(-122.4194), TargetLat: float(37.8044), TargetLon: float(-122.2712)}
	rep := idemtest.Explore(t, idemtest.Config[ridesapp.RideParams]{
		Pool:        b.pool,
		Schema:      b.schema.Name,
		DatabaseURL: b.schema.URL,
		Flow:        b.app.Flow(),
		Input:       input,
		Scope:       "user:" + itoa(b.goodUserID),
		Path:        "/rides",
		Compare:     idemtest.EqualJSON("ride_id", "charge_id"),
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			return b.checkOneRide(ctx, key, "charged")
		},
	})
	// ride_created and receipt_enqueued: 5 kinds each; charge_created: 6;
	// then two wire scenarios per round trip.
	if want := 16 + 2*rep.RoundTrips; rep.RoundTrips < 6 || len(rep.Scenarios) != want {
		t.Fatalf("explored %d scenarios over %d round trips, want %d:\n%s", len(rep.Scenarios), rep.RoundTrips, want, rep.Summary())
	}
	t.Logf("rides flow: %d crash scenarios and %d wire scenarios explored", 16, 2*rep.RoundTrips)
}

// The decline path: the 402 is the same whatever happens, and nobody is
// charged.
func TestRidesFlowDeclineAtEveryCrashPoint(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	input := ridesapp.RideParams{UserID: b.badUserID,
		OriginLat: float(1), OriginLon: float(2), TargetLat: float(3), TargetLon: float(4)}
	rep := idemtest.Explore(t, idemtest.Config[ridesapp.RideParams]{
		Pool:        b.pool,
		Schema:      b.schema.Name,
		DatabaseURL: b.schema.URL,
		Flow:        b.app.Flow(),
		Input:       input,
		Scope:       "user:" + itoa(b.badUserID),
		Compare:     idemtest.EqualJSON("ride_id"),
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			return b.checkOneRide(ctx, key, "declined")
		},
	})
	t.Logf("rides flow, declined card: %d crash scenarios and %d wire scenarios explored", len(rep.Scenarios)-2*rep.RoundTrips, 2*rep.RoundTrips)
}

// checkOneRide is the business invariant of one finished key: one ride in
// the expected payment status, one audit record, and, for a charged ride,
// one charge at the provider under the key's downstream key and one receipt
// job; for a declined ride, neither.
func (b *testBundle) checkOneRide(ctx context.Context, key *idemtype.KeyRecord, status string) error {
	var rideID int64
	var gotStatus, reference string
	var chargeID *string
	var rides int
	query, args := `SELECT count(*) OVER (), id, payment_status, charge_id, charge_reference FROM rides WHERE idempotency_key_id = $1`, []any{key.ID}
	if b.citus {
		// On one shard: Citus pushes a window function down only there.
		query, args = query+` AND scope = $2`, append(args, key.Scope)
	}
	err := b.pool.QueryRow(ctx, query, args...).Scan(&rides, &rideID, &gotStatus, &chargeID, &reference)
	if err != nil {
		return fmt.Errorf("the key's ride: %w", err)
	}
	if rides != 1 || gotStatus != status {
		return fmt.Errorf("%d rides, status %q; want 1 ride, %q", rides, gotStatus, status)
	}
	var audits, jobs int
	if err := b.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM audit_records WHERE resource_type = 'ride' AND resource_id = $1),
		(SELECT count(*) FROM river_job WHERE (args->>'ride_id')::bigint = $1)`, rideID).Scan(&audits, &jobs); err != nil {
		return err
	}
	var charges []string
	for _, c := range b.provider.Charges() {
		if c.IdempotencyKey == key.DownstreamKey(ridesapp.PhaseChargeCreated) || c.Description == ridesapp.ChargeDescription(reference) {
			charges = append(charges, c.ID)
		}
	}
	wantCharges, wantJobs := 1, 1
	if status == "declined" {
		wantCharges, wantJobs = 0, 0
	}
	switch {
	case audits != 1:
		return fmt.Errorf("%d audit records for ride %d, want 1", audits, rideID)
	case len(charges) != wantCharges:
		return fmt.Errorf("%d charges at the provider for ride %d (%v), want %d", len(charges), rideID, charges, wantCharges)
	case jobs != wantJobs:
		return fmt.Errorf("%d receipt jobs for ride %d, want %d", jobs, rideID, wantJobs)
	case wantCharges == 1 && (chargeID == nil || *chargeID != charges[0]):
		return fmt.Errorf("ride %d records charge %v, the provider made %s", rideID, chargeID, charges[0])
	}
	return nil
}
