package idem_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

// A phase statement that outlives Config.PhaseStatementTimeout fails the
// phase as the store not answering (docs/pgx-sqlc.md, "Timeouts"): it
// rolls back, the key is released, and the retry resumes at the phase.
func TestPhaseStatementTimeoutBoundsAPhase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slow := true
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		if !slow {
			return nil
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
		return err
	}
	// Generous against a loaded machine, and still far below the 30s sleep.
	r := b.runner(t, &idem.Config{PhaseStatementTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	in := rideInput{Origin: "a", Amount: 10}
	started := time.Now()
	out, err := r.Execute(context.Background(), b.flow, b.request("slow", in))
	require.Less(t, time.Since(started), 25*time.Second)
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, idem.OutcomeStoreUnavailable, out.Kind)
	rec := b.key(t, "slow")
	require.Equal(t, "ride_created", rec.RecoveryPoint)

	slow = false
	out, err = r.Execute(context.Background(), b.flow, b.request("slow", in))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
}
