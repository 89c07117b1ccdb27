package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

// The release before 0009 keeps acquiring on one connection across
// migration 0009 and back: idem_acquire_v8 (what it calls, called here as it
// does) reads the key into a variable of the keys table's row type, whose
// column 0009 adds and its down drops, and a session that compiled it before
// must not fail its next call. The keys it creates have no payload
// fingerprint.
func TestAcquireV8OnOneConnectionAcrossMigration0009(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	conn, err := schema.Pool.Acquire(ctx) // every acquisition on the same session
	require.NoError(t, err)
	defer conn.Release()
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)

	acquire := func(key string) {
		t.Helper()
		for _, want := range []string{"created", "none"} {
			var acquired string
			require.NoError(t, conn.QueryRow(ctx, `SELECT acquired FROM `+schema.Name+`.idem_acquire_v8(NULL, 's', $1, 'f', 'POST', '/', '\x01', '{}', 60000000, false, '', '', '', 0, '')`, key).Scan(&acquired), key)
			require.Equal(t, want, acquired, key)
		}
	}
	acquire("at-9")
	var payload []byte
	require.NoError(t, conn.QueryRow(ctx, `SELECT payload_fingerprint FROM `+schema.Name+`.idem_keys WHERE key = 'at-9'`).Scan(&payload))
	require.Nil(t, payload)
	_, err = m.Down(ctx, 8)
	require.NoError(t, err)
	acquire("at-8")
	_, err = m.Up(ctx)
	require.NoError(t, err)
	acquire("at-9-again")
	_, err = m.Down(ctx, 8)
	require.NoError(t, err)
	acquire("at-8-again")
}
