package pgtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/migrations"
)

// Migrating a schema through every version costs a test hundreds of milliseconds of DDL; emptying
// a migrated one costs a few. So a migrated schema is migrated once and then serves test after
// test of the same binary, as River's test schemas do: when a test ends, its schema is checked in
// (emptied and kept) if it still is exactly what the migrations made, and dropped otherwise; the
// next test that asks for a migrated schema checks one out, or migrates a new one when none is
// idle.
//
// "Exactly what the migrations made" is decided by the catalog, not by trust: after dropping the
// tables, views, sequences, functions and types a test added next to idem's, the schema's shape
// (every column, default, constraint, index, trigger, function body, domain, sequence setting,
// policy, rule, comment, grant and the rows of idem_migrations) must equal that of a freshly
// migrated schema, and no table may carry planner statistics from an ANALYZE. A test that
// migrated down, altered a table, added a trigger or a constraint, or analyzed its tables gets its
// schema dropped as before. The sessions a test left connected to its schema (they carry its
// application_name) are ended before the check, so nothing of one test reaches the next.

// migrated holds the schemas checked in, ready for the next test, and the shape of a freshly
// migrated schema, learnt from the first one the binary migrates.
var migrated struct {
	mu       sync.Mutex
	idle     []string
	baseline *schemaShape
}

// schemaShape is what a migrated schema is made of, with its own name taken out.
type schemaShape struct {
	fingerprint string
	// objects are the relations (tables, indexes, sequences, views), functions (by signature) and
	// types (domains, enums, any but a table's row type), by kind and name.
	objects map[string]bool
}

// NewMigratedSchema returns a schema of the test's own at idem's latest migration, as most tests
// of the runner, the store and their users need it: a schema checked in by an earlier test of the
// binary, emptied, or a new one migrated. When the test ends the pool is closed and the schema
// checked in or dropped (see migrated.go).
func NewMigratedSchema(t testing.TB) *Schema {
	t.Helper()
	schema, drop, err := OpenMigratedSchema(context.Background())
	return forTest(t, schema, drop, err)
}

// OpenMigratedSchema is NewMigratedSchema for code that has no testing.TB: the caller must call
// drop, which closes the pool and checks the schema in or drops it.
func OpenMigratedSchema(ctx context.Context) (schema *Schema, drop func() error, err error) {
	return openMigratedSchema(ctx, true)
}

// openMigratedSchema is OpenMigratedSchema; with reusable false, drop drops the schema whatever
// its shape, for a schema that something outside the database (a pgbouncer alias) knows by name.
func openMigratedSchema(ctx context.Context, reusable bool) (schema *Schema, drop func() error, err error) {
	dbURL, admin, err := sharedDatabase()
	if err != nil {
		return nil, nil, err
	}
	if name, ok := checkOut(); ok {
		schema, err := schemaPool(ctx, dbURL, name)
		if err != nil {
			return nil, nil, errors.Join(err, dropSchema(admin, name))
		}
		return schema, func() error {
			schema.Pool.Close()
			if !reusable {
				return dropSchema(admin, name)
			}
			return checkIn(admin, name)
		}, nil
	}

	schema, dropNew, err := openSchemaIn(ctx, dbURL, admin)
	if err != nil {
		return nil, nil, err
	}
	if err := migrate(ctx, schema); err != nil {
		return nil, nil, errors.Join(err, dropNew())
	}
	if !reusable {
		return schema, dropNew, nil
	}
	if err := learnBaseline(ctx, admin, schema.Name); err != nil {
		return nil, nil, errors.Join(err, dropNew())
	}
	return schema, func() error {
		schema.Pool.Close()
		return checkIn(admin, schema.Name)
	}, nil
}

func migrate(ctx context.Context, schema *Schema) error {
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	if err == nil {
		_, err = m.Up(ctx)
	}
	if err != nil {
		return fmt.Errorf("pgtest: migrate schema %s: %w", schema.Name, err)
	}
	return nil
}

func checkOut() (string, bool) {
	migrated.mu.Lock()
	defer migrated.mu.Unlock()
	n := len(migrated.idle)
	if n == 0 {
		return "", false
	}
	name := migrated.idle[n-1]
	migrated.idle = migrated.idle[:n-1]
	return name, true
}

// learnBaseline records the shape of the binary's first freshly migrated schema.
func learnBaseline(ctx context.Context, admin *pgxpool.Pool, name string) error {
	migrated.mu.Lock()
	known := migrated.baseline != nil
	migrated.mu.Unlock()
	if known {
		return nil
	}
	shape, err := readShape(ctx, admin, name)
	if err != nil {
		return err
	}
	migrated.mu.Lock()
	if migrated.baseline == nil {
		migrated.baseline = &shape.schemaShape
	}
	migrated.mu.Unlock()
	return nil
}

// checkIn empties a schema a test is done with and keeps it for the next test, if it still has
// the baseline's shape; otherwise, or if anything fails, it drops it.
func checkIn(admin *pgxpool.Pool, name string) error {
	migrated.mu.Lock()
	baseline := migrated.baseline
	migrated.mu.Unlock()
	if baseline == nil {
		return dropSchema(admin, name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reusable, err := empty(ctx, admin, name, baseline)
	if err != nil || !reusable {
		return dropSchema(admin, name)
	}
	migrated.mu.Lock()
	migrated.idle = append(migrated.idle, name)
	migrated.mu.Unlock()
	return nil
}

// empty ends the schema's sessions, drops what the test added beside idem's objects and, if what
// is left has the baseline's shape, truncates idem's tables. It reports whether the schema is
// ready for another test; when it is not, nothing was changed but the sessions ended.
func empty(ctx context.Context, admin *pgxpool.Pool, name string, baseline *schemaShape) (bool, error) {
	// The test's own pool is closed; any session still carrying the schema's application_name
	// was left behind by the code under test, and must not write into the next test's tables.
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()`, applicationName(name)); err != nil {
		return false, fmt.Errorf("pgtest: end the sessions of schema %s: %w", name, err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("pgtest: empty schema %s: %w", name, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A session we could not see (it set an application_name of its own) holding a lock on the
	// schema's tables: give up on reusing it rather than wait.
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
		return false, fmt.Errorf("pgtest: empty schema %s: %w", name, err)
	}
	objects, err := readObjects(ctx, tx, name)
	if err != nil {
		return false, err
	}
	var drops []string
	for object, drop := range objects.drops {
		if !baseline.objects[object] {
			drops = append(drops, drop)
		}
	}
	if len(drops) > 0 {
		slices.Sort(drops) // by the rank the query put first
		for _, drop := range drops {
			_, drop, _ = strings.Cut(drop, " ")
			if _, err := tx.Exec(ctx, drop); err != nil {
				return false, nil // a lock we could not get, an object dropped by an earlier CASCADE's kin: drop the schema
			}
		}
	}
	shape, err := readShape(ctx, tx, name)
	if err != nil {
		return false, err
	}
	if shape.fingerprint != baseline.fingerprint {
		return false, nil
	}
	if len(shape.tables) > 0 {
		if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(shape.tables, ", ")+" RESTART IDENTITY"); err != nil {
			return false, nil
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("pgtest: empty schema %s: %w", name, err)
	}
	return true, nil
}

func dropSchema(admin *pgxpool.Pool, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("pgtest: drop schema %s: %w", name, err)
	}
	return nil
}

// applicationName is the application_name of the sessions opened with a schema's URL, by which
// checkIn finds those a test left behind.
func applicationName(schema string) string { return "pgtest_" + schema }

// queryer is a pool or a transaction.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// shape is a schemaShape read from the catalog, with what drops each of its objects.
type shape struct {
	schemaShape
	drops  map[string]string // by kind and name: the statement that drops the object
	tables []string          // qualified, for TRUNCATE
}

// shapeQuery lists, one line each, everything a schema's shape is made of, or with $2 only its
// objects (relations, functions, types) and what drops them. $1 is the schema's name, taken out
// of every line (the migrations write it into function bodies, and the catalog into
// definitions), so that two schemas of the same shape give the same lines.
const shapeQuery = `
WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = $1),
objects(kind, name, line, drop, truncate) AS (
	SELECT 'relation', c.relname, concat_ws(' ', c.relkind, c.relpersistence, c.reloptions, c.relrowsecurity, c.relforcerowsecurity, c.relreplident, c.relacl),
	       -- Views first, then tables, then what their drops leave; not an index that backs a
	       -- constraint, nor a sequence that is an identity column's: their tables' drops take them.
	       CASE WHEN c.relkind IN ('i', 'I') AND EXISTS (SELECT FROM pg_constraint WHERE conindid = c.oid) THEN NULL
	            WHEN c.relkind = 'S' AND EXISTS (SELECT FROM pg_depend WHERE classid = 'pg_class'::regclass AND objid = c.oid AND deptype = 'i') THEN NULL
	            ELSE CASE c.relkind WHEN 'v' THEN '1' WHEN 'm' THEN '1' ELSE '2' END || ' DROP '
	                 || CASE c.relkind WHEN 'r' THEN 'TABLE' WHEN 'p' THEN 'TABLE' WHEN 'i' THEN 'INDEX' WHEN 'I' THEN 'INDEX' WHEN 'S' THEN 'SEQUENCE'
	                                   WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'f' THEN 'FOREIGN TABLE' END
	                 || ' IF EXISTS ' || c.oid::regclass || ' CASCADE' END,
	       CASE WHEN c.relkind IN ('r', 'p') AND c.relname <> 'idem_migrations' THEN c.oid::regclass::text END
	FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind <> 'c'
	UNION ALL
	SELECT 'type', t.typname, concat_ws(' ', t.typtype, format_type(t.typbasetype, t.typtypmod), t.typnotnull, t.typdefault, t.typacl,
	       (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid)),
	       '4 DROP TYPE IF EXISTS ' || t.oid::regtype || ' CASCADE', NULL
	FROM pg_type t WHERE t.typnamespace = (SELECT oid FROM ns) AND t.typtype <> 'b'
	  AND NOT (t.typtype = 'c' AND EXISTS (SELECT FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c'))
	UNION ALL
	SELECT 'function', p.oid::regprocedure::text, concat_ws(' ', p.prokind, p.proacl),
	       '3 DROP ROUTINE IF EXISTS ' || p.oid::regprocedure || ' CASCADE', NULL
	FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
),
details(kind, name, line, drop, truncate) AS (
	SELECT 'function body', p.oid::regprocedure::text, pg_get_functiondef(p.oid), NULL, NULL
	FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns) AND p.prokind IN ('f', 'p')
	UNION ALL
	SELECT 'column', c.relname, concat_ws(' ', a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity, a.attgenerated, a.attcollation, pg_get_expr(d.adbin, d.adrelid), a.attacl), NULL, NULL
	FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
	WHERE c.relnamespace = (SELECT oid FROM ns) AND a.attnum > 0 AND NOT a.attisdropped
	UNION ALL
	SELECT 'constraint', con.conname, concat_ws(' ', con.conrelid::regclass, con.contypid::regtype, pg_get_constraintdef(con.oid), con.convalidated, con.condeferrable, con.condeferred), NULL, NULL
	FROM pg_constraint con WHERE con.connamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'index', c.relname, pg_get_indexdef(c.oid), NULL, NULL
	FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('i', 'I')
	UNION ALL
	SELECT 'trigger', t.tgname, concat_ws(' ', pg_get_triggerdef(t.oid), t.tgenabled), NULL, NULL
	FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = (SELECT oid FROM ns) AND NOT t.tgisinternal
	UNION ALL
	SELECT 'sequence', c.relname, concat_ws(' ', s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle,
	       (SELECT d.refobjid::regclass::text || '.' || d.refobjsubid FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i'))), NULL, NULL
	FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'policy', pol.polname, concat_ws(' ', pol.polrelid::regclass, pol.polcmd, pol.polpermissive, pol.polroles, pg_get_expr(pol.polqual, pol.polrelid), pg_get_expr(pol.polwithcheck, pol.polrelid)), NULL, NULL
	FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid WHERE c.relnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'rule', r.rulename, r.definition, NULL, NULL FROM pg_rules r WHERE r.schemaname = $1
	UNION ALL
	SELECT 'comment', pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description, NULL, NULL
	FROM pg_description d
	WHERE (d.classoid = 'pg_class'::regclass AND d.objoid IN (SELECT oid FROM pg_class WHERE relnamespace = (SELECT oid FROM ns)))
	   OR (d.classoid = 'pg_proc'::regclass AND d.objoid IN (SELECT oid FROM pg_proc WHERE pronamespace = (SELECT oid FROM ns)))
	   OR (d.classoid = 'pg_type'::regclass AND d.objoid IN (SELECT oid FROM pg_type WHERE typnamespace = (SELECT oid FROM ns)))
	UNION ALL
	SELECT 'schema', nspname, concat_ws(' ', nspacl), NULL, NULL FROM pg_namespace WHERE oid = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'statistics', tablename, attname, NULL, NULL FROM pg_stats WHERE schemaname = $1
	UNION ALL
	SELECT 'statistics object', s.stxname, pg_get_statisticsobjdef(s.oid), NULL, NULL FROM pg_statistic_ext s WHERE s.stxnamespace = (SELECT oid FROM ns)
)
SELECT kind, replace(name, $1, ''), replace(coalesce(line, ''), $1, ''), coalesce(drop, ''), coalesce(truncate, '')
FROM (SELECT * FROM objects UNION ALL SELECT * FROM details WHERE NOT $2) lines
ORDER BY 1, 2, 3`

// readShape reads a schema's shape from the catalog, and idem_migrations' rows if it has them.
func readShape(ctx context.Context, db queryer, name string) (*shape, error) {
	return queryShape(ctx, db, name, false)
}

// readObjects is readShape for the objects only, without the fingerprint.
func readObjects(ctx context.Context, db queryer, name string) (*shape, error) {
	return queryShape(ctx, db, name, true)
}

func queryShape(ctx context.Context, db queryer, name string, objectsOnly bool) (*shape, error) {
	rows, err := db.Query(ctx, shapeQuery, name, objectsOnly)
	if err != nil {
		return nil, fmt.Errorf("pgtest: read the shape of schema %s: %w", name, err)
	}
	s := &shape{schemaShape: schemaShape{objects: map[string]bool{}}, drops: map[string]string{}}
	var b strings.Builder
	for rows.Next() {
		var kind, object, line, drop, truncate string
		if err := rows.Scan(&kind, &object, &line, &drop, &truncate); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgtest: read the shape of schema %s: %w", name, err)
		}
		fmt.Fprintf(&b, "%s %s: %s\n", kind, object, line)
		if kind == "relation" || kind == "function" || kind == "type" {
			s.objects[kind+" "+object] = true
		}
		if drop != "" {
			s.drops[kind+" "+object] = drop
		}
		if truncate != "" {
			s.tables = append(s.tables, truncate)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgtest: read the shape of schema %s: %w", name, err)
	}
	if s.objects["relation idem_migrations"] && !objectsOnly {
		versions, err := db.Query(ctx, "SELECT version, name FROM "+pgx.Identifier{name, "idem_migrations"}.Sanitize()+" ORDER BY version")
		if err != nil {
			return nil, fmt.Errorf("pgtest: read the versions of schema %s: %w", name, err)
		}
		for versions.Next() {
			var version int
			var migration string
			if err := versions.Scan(&version, &migration); err != nil {
				versions.Close()
				return nil, fmt.Errorf("pgtest: read the versions of schema %s: %w", name, err)
			}
			fmt.Fprintf(&b, "version %d %s\n", version, migration)
		}
		if err := versions.Err(); err != nil {
			return nil, fmt.Errorf("pgtest: read the versions of schema %s: %w", name, err)
		}
	}
	s.fingerprint = b.String()
	return s, nil
}
