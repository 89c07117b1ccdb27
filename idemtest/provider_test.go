package idemtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemtest"
)

func TestProviderDeduplicatesOnKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var p idemtest.Provider

	first, err := p.Do(ctx, "k1", "order-1")
	require.NoError(t, err)
	again, err := p.Do(ctx, "k1", "order-1")
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.Equal(t, idemtest.Effect{ID: "fx_1", Key: "k1", Subject: "order-1"}, first)
	require.NoError(t, p.ExpectOne("order-1"))

	_, err = p.Do(ctx, "k1", "order-2")
	require.ErrorContains(t, err, `key "k1" was first used for subject "order-1", not "order-2"`)

	calls := p.Calls()
	require.Len(t, calls, 3)
	require.False(t, calls[0].Deduplicated)
	require.True(t, calls[1].Deduplicated)
	require.Error(t, calls[2].Err)
	require.Len(t, p.Effects(""), 1)
}

func TestProviderChargesAgainWithoutAKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var p idemtest.Provider
	for range 2 {
		_, err := p.Do(ctx, "", "order-1")
		require.NoError(t, err)
	}
	require.Len(t, p.Effects("order-1"), 2)
	require.EqualError(t, p.ExpectOne("order-1"), `provider made 2 effects for "order-1", want exactly one: fx_1 (key ""), fx_2 (key "")`)
	require.EqualError(t, p.ExpectOne("order-2"), `provider made no effect for "order-2", want exactly one`)
}

func TestProviderFailNextMakesNoEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var p idemtest.Provider
	down := errors.New("provider down")
	p.FailNext(down)
	_, err := p.Do(ctx, "k1", "order-1")
	require.ErrorIs(t, err, down)
	require.Empty(t, p.Effects(""))

	e, err := p.Do(ctx, "k1", "order-1")
	require.NoError(t, err)
	require.Equal(t, "fx_1", e.ID)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = p.Do(cancelled, "k2", "order-2")
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, p.Calls(), 2, "a cancelled call never reaches the provider")
}
