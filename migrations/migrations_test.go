package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	schema   *pgtest.Schema
	migrator *migrations.Migrator
}

func setup(t *testing.T) *bundle {
	t.Helper()
	schema := pgtest.NewSchema(t)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	return &bundle{schema: schema, migrator: m}
}

func tableExists(t *testing.T, pool *pgxpool.Pool, qualified string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, qualified).Scan(&ok))
	return ok
}

func TestUpIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	v, err := b.migrator.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, v)

	res, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, res.From)
	require.Equal(t, migrations.Latest(), res.To)
	require.Len(t, res.Applied, migrations.Latest())
	require.True(t, tableExists(t, b.schema.Pool, b.schema.Name+".idem_keys"))

	res, err = b.migrator.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, res.Applied, "a second Up is a no-op")
	v, err = b.migrator.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}

// Several processes starting at once: each migration is applied exactly
// once and nobody fails.
func TestConcurrentUpAppliesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const migrators = 8
	var wg sync.WaitGroup
	applied := make(chan int, migrators)
	errs := make(chan error, migrators)
	start := make(chan struct{})
	for i := 0; i < migrators; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			m, err := migrations.New(b.schema.Pool, &migrations.Config{Schema: b.schema.Name})
			if err != nil {
				errs <- err
				return
			}
			res, err := m.Up(context.Background())
			if err != nil {
				errs <- err
				return
			}
			applied <- len(res.Applied)
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	close(applied)
	for err := range errs {
		require.NoError(t, err)
	}
	total := 0
	for n := range applied {
		total += n
	}
	require.Equal(t, migrations.Latest(), total)
}

func TestDownRevertsAndUpRestores(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	res, err := b.migrator.Down(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 0, res.To)
	require.False(t, tableExists(t, b.schema.Pool, b.schema.Name+".idem_keys"))
	v, err := b.migrator.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, v)

	_, err = b.migrator.Up(ctx)
	require.NoError(t, err)
	require.True(t, tableExists(t, b.schema.Pool, b.schema.Name+".idem_keys"))

	_, err = b.migrator.Down(ctx, migrations.Latest()+1)
	require.ErrorIs(t, err, migrations.ErrUnknownVersion)
}

// The printed SQL, applied by some other tool, leaves the schema exactly
// where Up would, and Version/Up agree with it afterwards.
func TestScriptAppliedByAnotherToolIsRecognised(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sql, err := b.migrator.Script(migrations.FormatSQL, migrations.DirectionUp, 0)
	require.NoError(t, err)
	require.Contains(t, sql, `"`+b.schema.Name+`".idem_keys`)
	_, err = b.schema.Pool.Exec(ctx, sql)
	require.NoError(t, err)

	v, err := b.migrator.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	res, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, res.Applied)

	down, err := b.migrator.Script(migrations.FormatSQL, migrations.DirectionDown, 0)
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(ctx, down)
	require.NoError(t, err)
	v, err = b.migrator.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, v)
}

func TestScriptFormats(t *testing.T) {
	t.Parallel()
	m, err := migrations.New(nil, &migrations.Config{Schema: "billing"})
	require.NoError(t, err)
	goose, err := m.Script(migrations.FormatGoose, "", 1)
	require.NoError(t, err)
	require.Contains(t, goose, "-- +goose Up")
	require.Contains(t, goose, "-- +goose Down")
	require.Contains(t, goose, `CREATE TABLE "billing".idem_keys`)
	tern, err := m.Script(migrations.FormatTern, "", 1)
	require.NoError(t, err)
	require.Contains(t, tern, "---- create above / drop below ----")
	require.NotContains(t, goose+tern, "{{schema}}")

	_, err = m.Script("flyway-xml", "", 1)
	require.Error(t, err)
	_, err = m.Script(migrations.FormatSQL, migrations.DirectionUp, 99)
	require.ErrorIs(t, err, migrations.ErrUnknownVersion)

	unqualified, err := migrations.New(nil, nil)
	require.NoError(t, err)
	plain, err := unqualified.Script(migrations.FormatSQL, migrations.DirectionUp, 0)
	require.NoError(t, err)
	require.True(t, strings.Contains(plain, "CREATE TABLE idem_keys"), plain)
}

func TestSchemaNamesAreValidated(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"1abc", "a b", `x"; DROP TABLE y; --`, strings.Repeat("a", 64), "ünï"} {
		_, err := migrations.New(nil, &migrations.Config{Schema: bad})
		require.ErrorIs(t, err, migrations.ErrInvalidSchema, bad)
	}
	for _, good := range []string{"idem", "Billing", "_x$1"} {
		_, err := migrations.New(nil, &migrations.Config{Schema: good})
		require.NoError(t, err, good)
	}
}

// A schema name that needs quoting (mixed case) works end to end.
func TestMixedCaseSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.schema.Pool.Exec(ctx, `CREATE SCHEMA "Idem_Mixed_`+b.schema.Name+`"`)
	require.NoError(t, err)
	m, err := migrations.New(b.schema.Pool, &migrations.Config{Schema: "Idem_Mixed_" + b.schema.Name})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.True(t, tableExists(t, b.schema.Pool, `"Idem_Mixed_`+b.schema.Name+`".idem_keys`))
	_, err = b.schema.Pool.Exec(ctx, `DROP SCHEMA "Idem_Mixed_`+b.schema.Name+`" CASCADE`)
	require.NoError(t, err)
}
