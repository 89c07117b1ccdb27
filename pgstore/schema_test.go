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

// A schema ahead of the code is accepted (from v0.2.0 on, schema changes
// are expand/contract); one that an unreleased development build migrated
// is refused, naming what to do.
func TestNewOnASchemaAheadOrUnreleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	_, err = schema.Pool.Exec(ctx, `INSERT INTO `+schema.Name+`.idem_migrations (version, name) VALUES ($1, 'future')`, migrations.Latest()+1)
	require.NoError(t, err)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	store.Close()

	_, err = schema.Pool.Exec(ctx, `UPDATE `+schema.Name+`.idem_migrations SET name = 'key_generation' WHERE version = 7`)
	require.NoError(t, err)
	_, err = pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorIs(t, err, migrations.ErrUnreleasedSchema)
	require.ErrorContains(t, err, "idem migrate down --to 6")
}
