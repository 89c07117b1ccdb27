package idem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// A key is bound to the method and path of its first request, as it is to
// the flow and the params: the same key sent with another method or to
// another path is a mismatch, whether the key finished or not, and an
// unfinished key is never taken over from elsewhere.
func TestKeyIsBoundToMethodAndPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	in := rideInput{Origin: "SF", Amount: 20}
	at := func(key, method, path string) idem.Request {
		req := b.request(key, in)
		req.Method, req.Path = method, path
		return req
	}

	out, err := r.Execute(ctx, b.flow, at("done", "POST", "/rides"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	for _, req := range []idem.Request{at("done", "PATCH", "/rides"), at("done", "POST", "/rides/"), at("done", "POST", "/quotes")} {
		out, err := r.Execute(ctx, b.flow, req)
		require.ErrorIs(t, err, idem.ErrMismatch, "%s %s", req.Method, req.Path)
		require.Equal(t, idem.OutcomeMismatch, out.Kind)
	}
	// An empty method is POST.
	out, err = r.Execute(ctx, b.flow, at("done", "", "/rides"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)

	// An unfinished, unlocked key: a failed phase released it.
	fail := true
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		if fail {
			return errors.New("provider timed out")
		}
		return nil
	}
	out, err = r.Execute(ctx, b.flow, at("open", "POST", "/rides"))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	fail = false
	for _, req := range []idem.Request{at("open", "PATCH", "/rides"), at("open", "POST", "/quotes")} {
		out, err := r.Execute(ctx, b.flow, req)
		require.ErrorIs(t, err, idem.ErrMismatch, "%s %s", req.Method, req.Path)
		require.Equal(t, idem.OutcomeMismatch, out.Kind)
	}
	rec := b.key(t, "open")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, "ride_created", rec.RecoveryPoint)
	require.Equal(t, int64(1), rec.Fence, "the key was not taken over")
	require.Nil(t, rec.LockedAt)

	out, err = r.Execute(ctx, b.flow, at("open", "POST", "/rides"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, map[string]int{"ride_created": 2, "charge_created": 3, "receipt_enqueued": 2}, b.counts.Get())
}
