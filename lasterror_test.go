package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

// A hook's "unknown" is recorded while the key waits; once a later verdict
// finishes the key, it is no longer the key's last error.
func TestFinishedKeyKeepsNoLastError(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	b.gateway.lose = true
	_, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	b.gateway.unknown = true
	_, err = r.Reconcile(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Contains(t, b.key(t, "k1").LastError, "gateway lookup timed out")

	b.gateway.unknown = false
	out, err := r.Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	rec := b.key(t, "k1")
	t.Logf("finished key: status=%s last_error=%q", rec.Status, rec.LastError)
	require.Equal(t, idem.StatusFinished, rec.Status)
	require.Empty(t, rec.LastError)
}
