package ridesapp_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
)

// The receipt job, queued with the 201, is worked in-process and records
// one receipt; however often the queue runs the job again (a retry after
// an error, a rescue after a crash), the ride still has one receipt.
func TestReceiptIsRecordedOncePerRide(t *testing.T) {
	t.Parallel()
	b := setup(t, &options{work: true})
	ctx := context.Background()
	completed, cancel := b.app.River().Subscribe(river.EventKindJobCompleted)
	t.Cleanup(cancel)
	waitCompleted := func() *river.Event {
		t.Helper()
		select {
		case ev := <-completed:
			return ev
		case <-time.After(30 * time.Second):
			t.Fatal("no receipt job completed within 30s")
			return nil
		}
	}

	ride := b.ride(t, newKey()).ride(t)
	ev := waitCompleted()
	require.Equal(t, ridesapp.ReceiptJobKind, ev.Job.Kind)

	var email, chargeID string
	var amount int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT email, charge_id, amount FROM receipts WHERE ride_id = $1`, ride.RideID).
		Scan(&email, &chargeID, &amount))
	require.Equal(t, ridesapp.GoodUserEmail, email)
	require.Equal(t, ride.ChargeID, chargeID)
	require.Equal(t, ridesapp.RideAmount, amount)

	// The same job delivered again.
	var args ridesapp.ReceiptArgs
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT args FROM river_job WHERE id = $1`, ev.Job.ID).Scan(&args))
	_, err := b.app.River().Insert(ctx, args, nil)
	require.NoError(t, err)
	ev = waitCompleted()
	require.Equal(t, ridesapp.ReceiptJobKind, ev.Job.Kind)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM receipts WHERE ride_id = $1`, ride.RideID))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM river_job WHERE state = 'completed'`))
}
