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

// A running key whose not-idempotent call is in doubt (its foreign mark
// stands) is never deleted as abandoned: the client's next request would run
// as a new request and repeat the call. The reaper moves it to
// needs_reconcile instead.
func TestReaperParksAbandonedKeyWithCallInDoubt(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	crashing := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookAfterForeign, "sms_sent"))})
	_, err := crashing.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	ref := b.ref(t, "k1")
	require.Equal(t, 1, b.gateway.times(ref))
	require.Equal(t, "sms_sent", b.key(t, "k1").ForeignMark)

	// The process died; nobody retried for a while (a NoRedrive flow, or the
	// completer had given up at MaxAttempts, or simply an UnfinishedRetention shorter
	// than the completer's cadence).
	b.clock.Advance(2 * time.Hour)
	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, UnfinishedRetention: time.Hour})
	res, err := r.Reap(ctx, nil)
	require.NoError(t, err)
	t.Logf("reaper: abandoned %d, moved to needs_reconcile %d", res.Unfinished, res.NeedsReconcile)
	require.Zero(t, res.Unfinished)
	require.Equal(t, 1, res.NeedsReconcile)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Equal(t, "sms_sent", rec.ForeignMark, "the mark still names the phase in doubt")

	// The client comes back.
	out, err := r.Execute(ctx, b.flow, b.req("k1"))
	t.Logf("retry: outcome=%s err=%v", out.Kind, err)
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, 1, b.gateway.times(ref), "the not-idempotent SMS was sent twice")
}
