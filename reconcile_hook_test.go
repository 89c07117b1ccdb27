package idem_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// smsFlowWithoutHook is the SMS flow as a binary declares it that does not
// know its send is not idempotent (an operations binary built without the
// option, or a deploy that switched the phase to idempotent while keys were
// in doubt): no Reconcile hook.
func smsFlowWithoutHook() *idem.Flow[smsInput] {
	advance := func(context.Context, idem.Tx, *idem.Attempt[smsInput]) (idem.Result, error) {
		return idem.Advance(), nil
	}
	return idem.MustNewFlow("sms.send", []idem.Phase[smsInput]{
		{Name: "message_saved", Do: advance},
		{Name: "sms_sent", Do: advance},
		{Name: "responded", Do: func(context.Context, idem.Tx, *idem.Attempt[smsInput]) (idem.Result, error) {
			return idem.RespondJSON(http.StatusCreated, map[string]any{}), nil
		}},
	}, nil)
}

// parkInDoubt leaves key in needs_reconcile with the send in doubt.
func (b *smsBundle) parkInDoubt(t *testing.T, key string) {
	t.Helper()
	b.gateway.lose = true
	_, err := b.runner(t, nil).Execute(context.Background(), b.flow, b.req(key))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	rec := b.key(t, key)
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Equal(t, "sms_sent", rec.ForeignMark)
}

// A reconcile run in a binary whose phase has no reconcile hook used to call
// a nil hook (a panic as a phase failure) and moved the key's fence and
// attempts on at every try. Now it is a stable error naming the flow and
// the phase, and the key is left exactly as it was.
func TestReconcileWithoutHookIsAStableErrorAndMovesNoCounter(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	b.parkInDoubt(t, "k1")
	before := b.key(t, "k1")

	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{smsFlowWithoutHook()}})
	for range 3 {
		out, err := r.Reconcile(ctx, "user:1", "k1")
		require.ErrorIs(t, err, idem.ErrNoReconcileHook)
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
		missing, ok := errors.AsType[*idem.NoReconcileHookError](err)
		require.True(t, ok, "%v", err)
		require.Equal(t, idem.NoReconcileHookError{Flow: "sms.send", Phase: "sms_sent"}, *missing)
		require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
		require.NotContains(t, err.Error(), "panic")
	}
	res, err := r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: 1})
	require.NoError(t, err)
	require.Equal(t, 1, res.NoHook)
	require.Zero(t, res.Failed)

	after := b.key(t, "k1")
	t.Logf("fence %d -> %d, attempts %d -> %d; error: %v", before.Fence, after.Fence, before.Attempts, after.Attempts,
		&idem.NoReconcileHookError{Flow: "sms.send", Phase: "sms_sent"})
	require.Equal(t, before.Fence, after.Fence, "no fence moved")
	require.Equal(t, before.Attempts, after.Attempts, "no attempt counted")
	require.Equal(t, idemtype.StoredNeedsReconcile, after.Status)
	require.Equal(t, "sms_sent", after.ForeignMark)
	require.Equal(t, before.LastError, after.LastError)

	// The binary that has the hook still reconciles it.
	out, err := b.runner(t, nil).Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
}

// CheckReconcileHooks (which the Maintainer runs at start) reports the keys
// in doubt at phases this binary has no reconcile hook for: in
// needs_reconcile, and still running with their mark standing (a crash after
// the call), which go there on their next attempt.
func TestCheckReconcileHooksReportsKeysInDoubtWithoutAHook(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	b.parkInDoubt(t, "parked")
	crashing := b.runner(t, crashAt(idemtest.HookAfterForeign, "sms_sent"))
	_, err := crashing.Execute(ctx, b.flow, b.req("crashed"))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	_, err = b.runner(t, nil).Execute(ctx, b.flow, b.req("fine"))
	require.NoError(t, err)

	missing, err := b.runner(t, nil).CheckReconcileHooks(ctx)
	require.NoError(t, err)
	require.Empty(t, missing, "the binary with the hook has nothing to report")

	without := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{smsFlowWithoutHook()}})
	missing, err = without.CheckReconcileHooks(ctx)
	require.NoError(t, err)
	t.Logf("reported: %+v", missing)
	require.Equal(t, []idem.MissingHook{{Flow: "sms.send", Phase: "sms_sent", Keys: 2, NeedsReconcile: 1}}, missing)
}
