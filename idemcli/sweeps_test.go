package idemcli

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

// An application's CLI run by an operator: `complete` hands a key whose
// not-idempotent call failed to reconciliation and says so with its exit
// code; `reconcile` run right after finds that key, and finishes it.
func TestCompleteThenReconcileRightAfter(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	ctx := context.Background()
	var gatewayDown atomic.Bool
	var sends atomic.Int32
	flow := idem.MustNewFlow("sms.send", []idem.Phase[payment]{{
		Name:    "sent",
		Foreign: idem.ForeignNotIdempotent,
		Do: func(ctx context.Context, _ idem.Tx, run *idem.Attempt[payment]) (idem.Result, error) {
			if err := run.Foreign(ctx, "send", func(context.Context, string) error {
				if gatewayDown.Load() {
					return errors.New("gateway timeout")
				}
				sends.Add(1)
				return nil
			}); err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(201, "sent"), nil
		},
		Reconcile: func(context.Context, idem.Tx, *idem.Attempt[payment]) (idem.ReconcileVerdict, error) {
			return idem.ReconcileNotHappened(), nil
		},
	}}, nil)

	// A request that died mid-flight two hours ago: its key is unfinished
	// and nobody holds it.
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	then := time.Now().Add(-2 * time.Hour)
	r, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{flow}, Test: idemtest.WithHook(idem.TestConfig{Now: func() time.Time { return then }}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookPhaseStart {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	require.NoError(t, err)
	_, err = r.Execute(ctx, flow, idem.Request{Scope: "s", Key: "k1", Params: payment{Card: "c", Amount: 1}})
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)

	cfg := &Config{Name: "smsctl", Flows: []idem.AnyFlow{flow}}
	gatewayDown.Store(true)
	stdout, stderr, code := runDB(t, schema, cfg, "complete")
	t.Logf("complete: exit %d: %s%s", code, stdout, stderr)
	require.Contains(t, stdout, "1 need reconciliation")
	require.Equal(t, ExitFailure, code, "a key left to reconciliation is work left undone")
	require.Contains(t, stderr, "smsctl reconcile")

	gatewayDown.Store(false)
	stdout, stderr, code = runDB(t, schema, cfg, "reconcile")
	t.Logf("reconcile right after: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "claimed 1 needs_reconcile key(s): 1 resolved")
	require.EqualValues(t, 1, sends.Load())
}
