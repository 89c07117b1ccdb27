package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	require.Contains(t, tern, "in one transaction")
	require.Contains(t, goose, "in one transaction")
	require.NotContains(t, goose+tern, "BEGIN;", "goose and tern open the transaction themselves")
	sql, err := m.Script(migrations.FormatSQL, migrations.DirectionUp, 0)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), strings.Count(sql, "\nBEGIN;\n"), "each version in a transaction of its own")
	require.Equal(t, migrations.Latest(), strings.Count(sql, "\nCOMMIT;\n"))
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

// schemaShape describes what a schema holds, for comparing two states of
// it: relations, columns (by name, with type, nullability, default and
// identity), constraints, indexes, functions and the recorded versions.
func schemaShape(t *testing.T, b *bundle) []string {
	t.Helper()
	rows, err := b.schema.Pool.Query(context.Background(), `
		WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = $1)
		SELECT 'relation ' || c.relkind::text || ' ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
		FROM pg_class c, ns WHERE c.relnamespace = ns.oid
		UNION ALL
		SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		       || ' ' || a.attnotnull || ' ' || a.attidentity::text || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN ns ON c.relnamespace = ns.oid
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
		UNION ALL
		SELECT 'constraint ' || c.relname || '.' || con.conname || ' ' || pg_get_constraintdef(con.oid)
		FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN ns ON c.relnamespace = ns.oid
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN ns ON c.relnamespace = ns.oid
		UNION ALL
		SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
		FROM pg_proc p, ns WHERE p.pronamespace = ns.oid
		UNION ALL
		SELECT 'trigger ' || tg.tgname || ' ' || c.relname
		FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid JOIN ns ON c.relnamespace = ns.oid
		WHERE NOT tg.tgisinternal`, b.schema.Name)
	require.NoError(t, err)
	shape, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	v, err := b.migrator.Version(context.Background())
	require.NoError(t, err)
	shape = append(shape, fmt.Sprintf("version %d", v))
	slices.Sort(shape)
	return shape
}

// Each version's down leaves the schema as the version before left it.
// (Columns are compared by name: a column a down adds back comes last.)
func TestEachDownRestoresThePreviousVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	shapes := [][]string{schemaShape(t, b)}
	for v := 1; v <= migrations.Latest(); v++ {
		script, err := b.migrator.Script(migrations.FormatSQL, migrations.DirectionUp, v)
		require.NoError(t, err)
		_, err = b.schema.Pool.Exec(ctx, script)
		require.NoError(t, err)
		shapes = append(shapes, schemaShape(t, b))
	}
	require.Contains(t, shapes[migrations.Latest()], "function idem_acquire(p_now timestamp with time zone, p_scope text, p_key text, p_flow text, p_method text, p_path text, p_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text)")
	for v := migrations.Latest(); v >= 1; v-- {
		_, err := b.migrator.Down(ctx, v-1)
		require.NoError(t, err)
		require.Equal(t, shapes[v-1], schemaShape(t, b), "down from %d", v)
		if v > 1 {
			_, err = b.migrator.Up(ctx)
			require.NoError(t, err)
			require.Equal(t, shapes[migrations.Latest()], schemaShape(t, b), "up again from %d", v-1)
			_, err = b.migrator.Down(ctx, v-1)
			require.NoError(t, err)
		}
	}
}

// A key in flight cannot cross 0007 in either direction: its fingerprint
// and downstream keys change. Up from v0.1.0's version 6 and Down from 7
// refuse with ErrRefused (SQLSTATE IDEM1) and a message that names the
// procedure while a key is unfinished, change nothing, and run once it has
// finished.
func TestVersion7RefusesWhileKeysAreInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	_, err = b.migrator.Down(ctx, 6)
	require.NoError(t, err)
	keys := b.schema.Name + ".idem_keys"
	// A key v0.1.0 left running, through its own acquisition function.
	_, err = b.schema.Pool.Exec(ctx, `SELECT * FROM `+b.schema.Name+`.idem_acquire(NULL, 's', 'k', 'f', 'POST', '/', '\x01', '{}', 60000000, false, '')`)
	require.NoError(t, err)

	_, err = b.migrator.Up(ctx)
	require.ErrorIs(t, err, migrations.ErrRefused)
	require.ErrorContains(t, err, "0007_v02_format: idem: 1 keys are unfinished")
	require.ErrorContains(t, err, "Upgrading to v0.2")
	t.Logf("refused: %v", err)
	v, err := b.migrator.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, v, "nothing was applied")

	finish := `UPDATE ` + keys + ` SET status = 'finished', recovery_point = 'finished', response_status = 201, finished_at = now(), expires_at = now() + interval '1 hour'`
	_, err = b.schema.Pool.Exec(ctx, finish)
	require.NoError(t, err)
	_, err = b.migrator.Up(ctx)
	require.NoError(t, err, "finished keys cross")

	_, err = b.schema.Pool.Exec(ctx, `SELECT * FROM `+b.schema.Name+`.idem_acquire(NULL, 's', 'k2', 'f', 'POST', '/', '\x01', '{}', 60000000, false, '', '', '', 0, '', 0)`)
	require.NoError(t, err)
	_, err = b.migrator.Down(ctx, 6)
	require.ErrorIs(t, err, migrations.ErrRefused)
	require.ErrorContains(t, err, "0007_v02_format")
	_, err = b.schema.Pool.Exec(ctx, finish)
	require.NoError(t, err)
	res, err := b.migrator.Down(ctx, 6)
	require.NoError(t, err)
	require.Equal(t, 6, res.To)
}

// After 0007, v0.1.0's call of idem_acquire fails with SQLSTATE 57P03,
// which v0.1.0 reports as the store unavailable (503): a v0.1.0 process
// left running acquires nothing.
func TestVersion7RefusesVersion6Acquisitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(ctx, `SELECT * FROM `+b.schema.Name+`.idem_acquire($1::timestamptz, $2::text, $3::text, $4::text, $5::text, $6::text,
    $7::bytea, $8::text, $9::bigint, $10::boolean, $11::text)`, nil, "s", "k", "f", "POST", "/", []byte{1}, "{}", int64(60000000), false, "")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "57P03", pgErr.Code)
	require.Contains(t, pgErr.Message, "deploy v0.2")
}

// A database that a development build of main migrated past v0.1.0 (its
// unreleased versions 7 to 11 used the numbers this release uses) is
// refused with a message that says what to do: by Version and Up, told by
// the name of its version 7, and by 0007 itself, told by its columns, when
// a tool applies the SQL.
func TestUnreleasedSchemaIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	b := setup(t)
	_, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	_, err = b.migrator.Down(ctx, 6)
	require.NoError(t, err)
	_, err = b.schema.Pool.Exec(ctx, `INSERT INTO `+b.schema.Name+`.idem_migrations (version, name) VALUES (7, 'key_generation'), (8, 'lease_holder')`)
	require.NoError(t, err)
	_, err = b.migrator.Version(ctx)
	require.ErrorIs(t, err, migrations.ErrUnreleasedSchema)
	_, err = b.migrator.Up(ctx)
	require.ErrorIs(t, err, migrations.ErrUnreleasedSchema)
	require.ErrorContains(t, err, "idem migrate down --to 6")
	t.Logf("refused: %v", err)

	c := setup(t)
	_, err = c.migrator.Up(ctx)
	require.NoError(t, err)
	_, err = c.migrator.Down(ctx, 6)
	require.NoError(t, err)
	_, err = c.schema.Pool.Exec(ctx, `ALTER TABLE `+c.schema.Name+`.idem_keys ADD COLUMN generation int NOT NULL DEFAULT 0`)
	require.NoError(t, err)
	_, err = c.migrator.Up(ctx)
	require.ErrorIs(t, err, migrations.ErrRefused)
	require.ErrorContains(t, err, "unreleased development build")
}

// A database ahead of this binary is refused by Up and Down.
func TestDatabaseAheadOfTheBinary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	latest := migrations.Latest()
	_, err = b.schema.Pool.Exec(ctx, `INSERT INTO `+b.schema.Name+`.idem_migrations (version, name) VALUES ($1, 'future')`, latest+1)
	require.NoError(t, err)
	_, err = b.migrator.Up(ctx)
	require.ErrorIs(t, err, migrations.ErrUnknownVersion)
	_, err = b.migrator.Down(ctx, latest)
	require.ErrorIs(t, err, migrations.ErrUnknownVersion)
}

// After Up the schema holds one acquisition function, idem_acquire (beside
// v0.1.0's signature of it, which only refuses), and no function with a
// version suffix.
func TestNoVersionedFunctions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	rows, err := b.schema.Pool.Query(ctx, `SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 ORDER BY 1`, b.schema.Name)
	require.NoError(t, err)
	functions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{
		"idem_acquire(p_now timestamp with time zone, p_scope text, p_key text, p_flow text, p_method text, p_path text, p_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text)",
		"idem_acquire(p_now timestamp with time zone, p_scope text, p_key text, p_flow text, p_method text, p_path text, p_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text, p_holder_instance text, p_holder_host text, p_holder_pid integer, p_holder_boot text, p_retention bigint)",
		"idem_leases_unlocked()",
		"idem_notify_waiters(p_scope text, p_key bigint)",
	}, functions)
}

// A business table partitioned by range whose rows reference a key: 0007
// moves its foreign key onto idem_keys (id) and back, the partitions' copies
// with it, instead of failing on a partition's inherited constraint.
func TestVersion7MovesPartitionedBusinessForeignKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Down(ctx, 6)
	require.NoError(t, err)
	_, err = b.migrator.Up(ctx)
	require.NoError(t, err)
	_, err = b.migrator.Down(ctx, 6)
	require.NoError(t, err)
	s := b.schema.Name
	_, err = b.schema.Pool.Exec(ctx, `
CREATE TABLE `+s+`.orders (id bigint, key_id bigint REFERENCES `+s+`.idem_keys (id) ON DELETE SET NULL) PARTITION BY RANGE (id);
CREATE TABLE `+s+`.orders_1 PARTITION OF `+s+`.orders FOR VALUES FROM (0) TO (1000);
CREATE TABLE `+s+`.orders_2 PARTITION OF `+s+`.orders FOR VALUES FROM (1000) TO (2000)`)
	require.NoError(t, err)
	fks := func() int {
		var n int
		require.NoError(t, b.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND confrelid = $1::regclass AND conrelid::regclass::text LIKE '%orders%'`, s+".idem_keys").Scan(&n))
		return n
	}
	require.Equal(t, 3, fks(), "the parent's and each partition's")
	_, err = b.migrator.Up(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, fks())
	_, err = b.migrator.Down(ctx, 6)
	require.NoError(t, err)
	require.Equal(t, 3, fks())
}

// A server whose default isolation is repeatable read: Up still runs 0007
// at read committed, so its check for keys in flight sees what committed
// while it waited for its lock; run in a transaction at repeatable read
// (UpTx), 0007 refuses.
func TestVersion7RunsAtReadCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Down(ctx, 6)
	require.NoError(t, err)
	tx, err := b.schema.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = b.migrator.UpTx(ctx, tx)
	require.ErrorIs(t, err, migrations.ErrRefused)
	require.ErrorContains(t, err, "read committed")
	require.NoError(t, tx.Rollback(ctx))

	cfg := b.schema.Pool.Config()
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m, err := migrations.New(pool, &migrations.Config{Schema: b.schema.Name})
	require.NoError(t, err)
	res, err := m.Up(ctx)
	require.NoError(t, err)
	require.Equal(t, 7, res.To)
}

// A migration that cannot get a table's lock (a long transaction reads
// idem_keys) gives up after Config.LockTimeout with ErrLockTimeout, rather
// than queueing every statement of the application behind its ACCESS
// EXCLUSIVE request for as long as that transaction runs; nothing of it is
// applied.
func TestMigrationGivesUpWaitingForALock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	m, err := migrations.New(b.schema.Pool, &migrations.Config{Schema: b.schema.Name, LockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)

	reader, err := b.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(ctx) }()
	_, err = reader.Exec(ctx, `SELECT count(*) FROM idem_keys`)
	require.NoError(t, err)

	_, err = m.Down(ctx, 6)
	require.ErrorIs(t, err, migrations.ErrLockTimeout)
	require.Contains(t, err.Error(), "another transaction")
	version, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), version, "nothing reverted")

	require.NoError(t, reader.Rollback(ctx))
	_, err = m.Down(ctx, 6)
	require.NoError(t, err, "with the reader gone the migration runs")
}
