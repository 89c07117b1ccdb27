package pgstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// A store on a schema that was never migrated, or is older than the code,
// fails at construction with a clear error, not on the first request.
func TestNewChecksTheSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	_, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, "idem migrate up")

	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	_, err = m.Down(ctx, migrations.Latest()-1)
	require.NoError(t, err)
	_, err = pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, "this code needs")

	_, err = m.Up(ctx)
	require.NoError(t, err)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	store.Close()
}
