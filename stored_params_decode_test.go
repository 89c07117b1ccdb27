package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// strandAt leaves key in flight at the recovery point before phase, with
// params as the key's stored params, as a binary with another input type
// would have stored them; and lets its lease expire and the key go idle.
func (b *testBundle) strandAt(t *testing.T, key, phase, params string) {
	t.Helper()
	crashing := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, phase))})
	_, err := crashing.Execute(context.Background(), b.flow, b.request(key, rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	_, err = b.pool.Exec(context.Background(), `UPDATE idem_keys SET params = $1::jsonb WHERE key = $2`, params, key)
	require.NoError(t, err)
	b.clock.Advance(time.Hour)
}

// The completer decodes stored params into today's input type tolerantly:
// a member the type no longer has is ignored, a field it gained (here
// amount, absent from the stored params) gets its zero value.
func TestCompleterDecodesStoredParamsTolerantly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.strandAt(t, "k1", "charge_created", `{"origin": "SF", "removed_since": [1, 2]}`)
	var amounts []float64
	b.hooks["charge_created"] = func(_ context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) error {
		amounts = append(amounts, run.Input().Amount)
		return nil
	}
	res, err := b.runner(t, nil).Complete(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Completed: 1}, res)
	require.Equal(t, []float64{0}, amounts, "a field the stored params lack: its zero value")
	require.Equal(t, idemtype.StoredFinished, b.key(t, "k1").Status)
	t.Logf("tolerant decode: %+v", *res)
}

// Stored params that do not decode into today's input type are recorded on
// the key (last error, an attempt) and reported (ErrUndecodableParams,
// counted failed), the key is released rather than skipped on every pass,
// it turns stale after MaxAttempts, and the client's retry, which brings
// its own input, finishes it.
func TestCompleterReportsUndecodableParams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.strandAt(t, "k1", "charge_created", `{"origin": 7, "amount": 20}`)
	before := b.key(t, "k1").Attempts
	obs := newCountingObserver()
	r := b.runner(t, &idem.Config{Observer: obs})
	cfg := &idem.CompleteConfig{MaxAttempts: before + 2}

	res, err := r.Complete(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Failed: 1}, res)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Nil(t, rec.LockedAt, "released, not left locked")
	require.Equal(t, before+1, rec.Attempts)
	require.Contains(t, rec.LastError, idem.ErrUndecodableParams.Error())
	require.Equal(t, 0, b.counts.Get()["charge_created"], "no phase ran")
	require.Equal(t, 1, obs.n(idem.EventPhaseFailed))
	t.Logf("undecodable params: %+v, last error %q", *res, rec.LastError)

	b.clock.Advance(time.Hour)
	res, err = r.Complete(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, 1, res.Failed)
	b.clock.Advance(time.Hour)
	res, err = r.Complete(ctx, cfg)
	require.NoError(t, err)
	require.Zero(t, res.Claimed, "stale after MaxAttempts: left to an operator, not retried forever")

	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
}

// A reconcile run on a key whose stored params do not decode leaves it in
// needs_reconcile with the reason, and says so with ErrUndecodableParams.
func TestReconcileReportsUndecodableParams(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	b.crashAfterSend(t, "k1")
	b.clock.Advance(2 * time.Minute)
	r := b.runner(t, nil)
	_, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET params = '{"to": 7}'::jsonb WHERE key = 'k1'`)
	require.NoError(t, err)

	out, err := r.Reconcile(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrUndecodableParams)
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Contains(t, rec.LastError, idem.ErrUndecodableParams.Error())
	require.Zero(t, b.counts.Get()["reconcile"], "no hook ran on an input it cannot see")
	t.Logf("reconcile: %s, last error %q", out.Kind, rec.LastError)
}
