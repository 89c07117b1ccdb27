package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

// Once a finished key has expired, a request with the same key and body runs
// as a new request (the expired row is replaced and every phase runs
// again). Its downstream idempotency keys must differ from the old
// request's, or a provider that still remembers them returns the OLD charge:
// a second ride answered as charged with no charge. The replacing key is one
// generation on, and its downstream keys hash the generation in.
func TestReusedExpiredKeyGetsNewDownstreamKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, &idem.Config{Retention: time.Hour})
	req := b.request("order-42", rideInput{Origin: "SF", Amount: 20})
	first, err := r.Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, first.Kind)

	b.clock.Advance(2 * time.Hour) // the key expired: the next request is a new one
	second, err := r.Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, second.Kind, "run as a new request, not replayed")
	require.Equal(t, 2, b.countRows(t, "rides"), "a second ride was created")
	require.NotEqual(t, first.Response.Body, second.Response.Body)
	require.Equal(t, 2, b.provider.Charges(), "the second ride was answered as charged, but the provider returned the first ride's charge")
	require.Zero(t, first.Record.Generation)
	require.Equal(t, 1, second.Record.Generation)
	require.NotEqual(t, first.Record.DownstreamKey("charge_created"), second.Record.DownstreamKey("charge_created"))
	require.Equal(t, first.Record.Fingerprint, second.Record.Fingerprint, "the same request, one generation on")
	t.Logf("generation %d sent %s, generation %d sent %s", first.Record.Generation, first.Record.DownstreamKey("charge_created"),
		second.Record.Generation, second.Record.DownstreamKey("charge_created"))
}
