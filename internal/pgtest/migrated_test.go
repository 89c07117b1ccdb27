package pgtest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/migrations"
)

// freshMigrated is a newly migrated schema that no other test can check out, and the binary's
// baseline shape.
func freshMigrated(t *testing.T) (*Schema, *pgxpool.Pool, *schemaShape) {
	t.Helper()
	ctx := context.Background()
	schema, drop, err := openMigratedSchema(ctx, false)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, drop()) })
	_, admin, err := sharedDatabase()
	require.NoError(t, err)
	require.NoError(t, learnBaseline(ctx, admin, schema.Name))
	migrated.mu.Lock()
	baseline := migrated.baseline
	migrated.mu.Unlock()
	return schema, admin, baseline
}

func TestMigratedSchemaEmptiedForTheNextTest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, admin, baseline := freshMigrated(t)

	// What a test of the runner does: tables of its own beside idem's, keys in idem's.
	_, err := schema.Pool.Exec(ctx, `
		CREATE TABLE rides (id bigserial PRIMARY KEY, key_id bigint REFERENCES idem_keys (id));
		CREATE INDEX rides_key ON rides (key_id);
		CREATE FUNCTION ride_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM rides';
		CREATE DOMAIN origin AS text CHECK (VALUE <> '');
		CREATE VIEW ride_keys AS SELECT rides.id, idem_keys.key FROM rides JOIN idem_keys ON idem_keys.id = rides.key_id;
		INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, expires_at)
		VALUES ('s', 'k', 'f', 'POST', '/', '\x00', '{}', now() + interval '1 day');
		INSERT INTO rides (key_id) SELECT id FROM idem_keys`)
	require.NoError(t, err)
	// A session the code under test left open on the schema.
	leftOpen, err := pgx.Connect(ctx, schema.URL)
	require.NoError(t, err)
	defer leftOpen.Close(ctx)
	schema.Pool.Close()

	reusable, err := empty(ctx, admin, schema.Name, baseline)
	require.NoError(t, err)
	require.True(t, reusable)
	require.Error(t, leftOpen.Ping(ctx), "the session left open is ended")

	again, err := schemaPool(ctx, DatabaseURL(t), schema.Name)
	require.NoError(t, err)
	defer again.Pool.Close()
	var keys int
	require.NoError(t, again.Pool.QueryRow(ctx, "SELECT count(*) FROM idem_keys").Scan(&keys))
	require.Zero(t, keys)
	var leftovers []string
	rows, err := again.Pool.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relname LIKE 'ride%'
		UNION ALL SELECT proname FROM pg_proc WHERE pronamespace = $1::regnamespace AND proname = 'ride_count'
		UNION ALL SELECT typname FROM pg_type WHERE typnamespace = $1::regnamespace AND typname = 'origin'`, schema.Name)
	require.NoError(t, err)
	leftovers, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, leftovers, "what the test added is dropped")
	var id int64
	require.NoError(t, again.Pool.QueryRow(ctx, `INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, expires_at)
		VALUES ('s', 'k', 'f', 'POST', '/', '\x00', '{}', now() + interval '1 day') RETURNING id`).Scan(&id))
	require.Equal(t, int64(1), id, "sequences start over")

	shape, err := readShape(ctx, admin, schema.Name)
	require.NoError(t, err)
	require.Equal(t, baseline.fingerprint, shape.fingerprint)
}

func TestMigratedSchemaChangedIsNotReused(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]string{
		"MigratedDown":     "",
		"ColumnAdded":      "ALTER TABLE idem_keys ADD COLUMN note text",
		"ConstraintAdded":  "ALTER TABLE idem_keys ADD CONSTRAINT short_keys CHECK (length(key) < 10)",
		"TriggerAdded":     "CREATE TRIGGER again AFTER UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
		"FunctionReplaced": "", // set below: idem's own function, with another body
		"Analyzed":         "INSERT INTO idem_migrations VALUES (1000, 'extra'); ANALYZE idem_migrations",
		"VersionRowAdded":  "INSERT INTO idem_migrations VALUES (1000, 'extra')",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			schema, admin, baseline := freshMigrated(t)
			switch name {
			case "MigratedDown":
				m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
				require.NoError(t, err)
				_, err = m.Down(ctx, migrations.Latest()-1)
				require.NoError(t, err)
			case "FunctionReplaced":
				var definition string
				require.NoError(t, admin.QueryRow(ctx, `SELECT pg_get_functiondef(oid) FROM pg_proc
					WHERE pronamespace = $1::regnamespace AND proname = 'idem_notify_waiters'`, schema.Name).Scan(&definition))
				require.Contains(t, definition, "BEGIN")
				_, err := schema.Pool.Exec(ctx, strings.Replace(definition, "BEGIN", "BEGIN\n    -- changed", 1))
				require.NoError(t, err)
			default:
				_, err := schema.Pool.Exec(ctx, change)
				require.NoError(t, err)
			}
			reusable, err := empty(ctx, admin, schema.Name, baseline)
			require.NoError(t, err)
			require.False(t, reusable)
		})
	}
}

// BenchmarkNewMigratedSchema is the setup a test pays for a migrated schema: a fresh one
// migrated through every version, against one checked in by an earlier test and emptied.
func BenchmarkNewMigratedSchema(b *testing.B) {
	ctx := context.Background()
	b.Run("Migrated", func(b *testing.B) {
		for b.Loop() {
			_, drop, err := openMigratedSchema(ctx, false)
			require.NoError(b, err)
			require.NoError(b, drop())
		}
	})
	b.Run("Reused", func(b *testing.B) {
		for b.Loop() {
			schema, drop, err := OpenMigratedSchema(ctx)
			require.NoError(b, err)
			_, err = schema.Pool.Exec(ctx, "CREATE TABLE rides (id bigserial PRIMARY KEY, key_id bigint REFERENCES idem_keys (id))")
			require.NoError(b, err)
			require.NoError(b, drop())
		}
	})
}
