package idem_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

// acquireOnOneSessionAcross checks that a session of the release before
// migration version keeps acquiring across it and back: call is the
// acquisition that release makes (a function call's text, its schema
// prefixed, the key as $1), run twice per key on one connection (created,
// then none) at version, at version-1, at version again and at version-1
// again. PL/pgSQL keeps a function compiled per session with the row types
// it saw, which a migration that adds or drops a column changes. atLatest,
// when not nil, runs after the first key, on the same connection.
func acquireOnOneSessionAcross(t *testing.T, version int, call string, atLatest func(ctx context.Context, conn *pgxpool.Conn, schema *pgtest.Schema)) {
	t.Helper()
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
			require.NoError(t, conn.QueryRow(ctx, `SELECT acquired FROM `+schema.Name+`.`+call, key).Scan(&acquired), key)
			require.Equal(t, want, acquired, key)
		}
	}
	at := func(v int, again string) string { return fmt.Sprintf("at-%d%s", v, again) }
	acquire(at(version, ""))
	if atLatest != nil {
		atLatest(ctx, conn, schema)
	}
	_, err = m.Down(ctx, version-1)
	require.NoError(t, err)
	acquire(at(version-1, ""))
	_, err = m.Up(ctx)
	require.NoError(t, err)
	acquire(at(version, "-again"))
	_, err = m.Down(ctx, version-1)
	require.NoError(t, err)
	acquire(at(version-1, "-again"))
}
