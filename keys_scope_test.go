package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// Listing keys across tenants is explicit (AllScopes), as GetKey and
// UnlockKey refuse an empty scope; and a listing carries a key's metadata
// only, its input, checkpoint data and response only when asked (Reveal).
func TestListKeysNeedsAScopeOrAllScopes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	for _, scope := range []string{"tenant:1", "tenant:2"} {
		_, err := r.Execute(ctx, b.flow, idem.Request{Scope: scope, Key: "k1", Params: rideInput{Origin: "SF", Amount: 5}})
		require.NoError(t, err)
	}

	for name, q := range map[string]idemtype.KeyQuery{
		"no scope":                {},
		"no scope, by state":      {State: idemtype.KeyStateFinished},
		"a scope and all of them": {Scope: "tenant:1", AllScopes: true},
	} {
		_, err := r.ListKeys(ctx, q)
		require.ErrorIs(t, err, idem.ErrInvalidRequest, name)
	}

	list, err := r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true})
	require.NoError(t, err)
	require.Len(t, list.Keys, 2)
	list, err = r.ListKeys(ctx, idemtype.KeyQuery{Scope: "tenant:2"})
	require.NoError(t, err)
	require.Len(t, list.Keys, 1)
	k := list.Keys[0]
	require.Equal(t, "tenant:2", k.Scope)
	require.Equal(t, idemtype.StoredFinished, k.Status)
	require.Equal(t, 201, k.ResponseStatus, "metadata is listed")
	require.Nil(t, k.Params, "the input is not, without Reveal")
	require.Empty(t, k.Checkpoint)
	require.Empty(t, k.ResponseHeaders)
	require.Nil(t, k.ResponseBody)

	list, err = r.ListKeys(ctx, idemtype.KeyQuery{Scope: "tenant:2", Reveal: true})
	require.NoError(t, err)
	k = list.Keys[0]
	require.JSONEq(t, `{"origin": "SF", "amount": 5}`, string(k.Params))
	require.Contains(t, k.Checkpoint, "ride_id")
	require.NotEmpty(t, k.ResponseHeaders)
	require.NotEmpty(t, k.ResponseBody)

	// GetKey names one key of one scope, and returns all of it.
	rec, _, err := r.GetKey(ctx, "tenant:2", "k1")
	require.NoError(t, err)
	require.Equal(t, k.Params, rec.Params)
	require.Equal(t, k.ResponseBody, rec.ResponseBody)
}
