package idem_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/pgtest"
)

// Every query exec mode pgx offers runs the store and the runner: a new
// key, its replay and a key resumed after a failed phase, on a direct
// connection.
func TestExecModesOnDirectConnection(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.QueryExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.store = storeOn(t, b.schema, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			runExecModeFlow(t, b)
		})
	}
}

// runExecModeFlow runs a key to its end, replays it, and resumes a key whose
// second phase failed once.
func runExecModeFlow(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	r := b.runner(t, nil)

	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Paris", Amount: 10}))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, out.Response.Status)

	again, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Paris", Amount: 10}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, again.Kind)
	require.Equal(t, out.Response.Body, again.Response.Body)
	require.Equal(t, out.Response.Header.Get("X-Ride"), again.Response.Header.Get("X-Ride"))

	failed := false
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		if !failed {
			failed = true
			return errPhaseOnce
		}
		return nil
	}
	_, err = r.Execute(ctx, b.flow, b.request("k2", rideInput{Origin: "Lyon", Amount: 5}))
	require.ErrorIs(t, err, errPhaseOnce)
	out, err = r.Execute(ctx, b.flow, b.request("k2", rideInput{Origin: "Lyon", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.Equal(t, 2, b.countRows(t, "rides"))
	require.Equal(t, 2, b.countRows(t, "jobs"))
	require.Equal(t, 2, b.provider.Calls())
}

var errPhaseOnce = errors.New("the phase fails once")
