package idem_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/migrations"
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
	require.Len(t, first.Record.Fingerprint, 32, "generation 0: the input scheme, which the previous release compares")
	require.Equal(t, idemdriver.DownstreamByRequest, first.Record.DownstreamScheme)
	// Generation 1 binds the generation into its fingerprint (scheme 3), so
	// a release that knows no generation, resuming it with its completer,
	// derives the same downstream key, and cannot compare it on a retry.
	bound := sha256.Sum256(append(append([]byte(nil), second.Record.PayloadFingerprint...), '1'))
	require.Equal(t, append([]byte{3}, bound[:]...), second.Record.Fingerprint)
	require.Equal(t, idemdriver.DownstreamByGeneration, second.Record.DownstreamScheme)
	noGeneration := *second.Record
	noGeneration.Generation, noGeneration.DownstreamScheme = 0, idemdriver.DownstreamByRequest
	require.Equal(t, noGeneration.DownstreamKey("charge_created"), second.Record.DownstreamKey("charge_created"),
		"what a release that knows no generation derives")
	t.Logf("generation %d sent %s, generation %d sent %s", first.Record.Generation, first.Record.DownstreamKey("charge_created"),
		second.Record.Generation, second.Record.DownstreamKey("charge_created"))

	// A key in flight at generation 1 holds migration 0007's down back: the
	// down would change the downstream key its retry sends.
	b.clock.Advance(2 * time.Hour)
	crashing := b.runner(t, &idem.Config{Retention: time.Hour, Test: idem.TestConfig{Hook: crashAt(idem.HookAfterForeign, "charge_created")}})
	_, err = crashing.Execute(ctx, b.flow, req)
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	require.Equal(t, 2, b.key(t, "order-42").Generation)
	m, err := migrations.New(b.pool, &migrations.Config{Schema: b.schema.Name})
	require.NoError(t, err)
	_, err = m.Down(ctx, 8)
	t.Logf("0009 down with a generation-2 key in flight: %v", err)
	require.ErrorIs(t, err, migrations.ErrRefused)
	// A key of generation 2 made before 0009 (scheme 2, the generation
	// hashed in) holds 0007's down back.
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET downstream_scheme = 2 WHERE key = 'order-42'`)
	require.NoError(t, err)
	_, err = m.Down(ctx, 6)
	t.Logf("0007 down with a generation-2 key in flight: %v", err)
	require.ErrorIs(t, err, migrations.ErrRefused)
	require.ErrorContains(t, err, "0007_key_generation")
}
