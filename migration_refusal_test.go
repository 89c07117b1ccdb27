package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/migrations"
)

// Reverting migration 0002 on a database with a key in flight would change
// that key's downstream idempotency key (back to the request-id scheme), so
// its retry would look new to the provider and charge again: the down
// refuses (migrations.ErrRefused) and reverts nothing, and the retry sends
// the key the first attempt sent.
func TestMigration0002DownRefusesWhileKeysAreInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.abandon(t, "k1")
	before := b.key(t, "k1").DownstreamKey("charge_created")
	require.Equal(t, 1, b.provider.Charges())

	m, err := migrations.New(b.pool, &migrations.Config{Schema: b.schema.Name})
	require.NoError(t, err)
	_, err = m.Down(ctx, 1)
	t.Logf("down to 1 with a key in flight: %v", err)
	require.ErrorIs(t, err, migrations.ErrRefused)
	require.ErrorContains(t, err, "0002_downstream_scheme")
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v, "nothing was reverted")

	store := storeOn(t, b.schema, func(*pgxpool.Config) {})
	rec, err := store.GetKey(ctx, "user:1", "k1")
	require.NoError(t, err)
	after := rec.DownstreamKey("charge_created")
	t.Logf("downstream key before=%s after=%s (scheme %d)", before, after, rec.DownstreamScheme)

	b.clock.Advance(2 * time.Minute)
	r, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Test: idem.TestConfig{Now: b.clock.Now}})
	require.NoError(t, err)
	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20})) // abandon's request
	t.Logf("retry: %s %v", out.Kind, err)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, before, after)
	require.Equal(t, 1, b.provider.Charges(), "charged twice")
}
