package pgstore_test

import (
	"context"
	"fmt"
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

// A schema ahead of the code: New accepts it when the versions past the
// code's have floors it knows (their migrations only added), and refuses
// it, naming the release needed, otherwise.
func TestNewOnASchemaAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	latest := migrations.Latest()
	_, err = schema.Pool.Exec(ctx, `INSERT INTO `+schema.Name+`.idem_migrations (version, name, floor) VALUES ($1, 'future', $2)`, latest+1, latest)
	require.NoError(t, err)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	store.Close()

	_, err = schema.Pool.Exec(ctx, `UPDATE `+schema.Name+`.idem_migrations SET floor = $1 WHERE version = $1`, latest+1)
	require.NoError(t, err)
	_, err = pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorIs(t, err, migrations.ErrUnknownVersion)
	require.ErrorContains(t, err, fmt.Sprintf("needs a binary that knows version %d or later", latest+1))
}

// Config.Citus on tables Citus does not distribute is refused at New:
// every statement about a key would name idem_leases.scope, which the plain
// layout does not have.
func TestNewRefusesCitusOnAPlainSchema(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	_, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name, Citus: true})
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, "not distributed by Citus")
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	store.Close()
}
