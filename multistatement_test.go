package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/pgstore"
)

// An argument-less Exec goes over the simple protocol, where a COMMIT later
// in the same string would commit the phase's writes without the recovery
// point: a transaction-control statement anywhere in a string of several is
// refused (pgstore.ErrPhaseEndedTx) before it reaches the server, so the
// failed phase's write rolls back.
func TestMultiStatementStringCannotCommitThePhase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	runs := 0
	flow := idem.MustNewFlow("commit.bypass2", []idem.Phase[rideInput]{{
		Name: "write",
		Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO jobs (ride_id, kind) VALUES (0, 'side-write'); COMMIT`)
			if !errors.Is(err, pgstore.ErrPhaseEndedTx) {
				return idem.Result{}, fmt.Errorf("a multi-statement string through the phase's Tx: %v", err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO jobs (ride_id, kind) VALUES (0, 'side-write'); SET LOCAL lock_timeout = '5s'`); err != nil {
				return idem.Result{}, err
			}
			if runs++; runs == 1 {
				return idem.Result{}, errors.New("fail the first run after the write")
			}
			return idem.RespondJSON(http.StatusCreated, map[string]any{"ok": true}), nil
		},
	}}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	_, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "SF"}))
	t.Logf("first: %v", err)
	out, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "SF"}))
	t.Logf("second: %v %v", out.Kind, err)
	require.NoError(t, err)
	require.Equal(t, 1, b.countRows(t, "jobs WHERE kind = 'side-write'"), "the failed phase's write was committed")
}
