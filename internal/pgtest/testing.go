package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sharedStartTimeout bounds the lazy start, long enough for docker to pull an image.
const sharedStartTimeout = 5 * time.Minute

// shared is the test binary's server and database, started by the first test that asks.
var shared struct {
	mu      sync.Mutex
	started bool
	server  *Server
	dbURL   string
	pool    *pgxpool.Pool // to dbURL, for creating and dropping schemas
	err     error
}

// Main runs the tests, then stops the server and drops the database they used, and exits with the
// tests' status. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Without it, a local server still dies with the test binary, and what it leaves on disk or on an
// external server is removed by a later run.
func Main(m *testing.M) {
	code := m.Run()
	if err := stopSharedCitus(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: stopping the Citus cluster after the tests: %v\n", err)
	}
	if err := stopSharedBouncer(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: stopping pgbouncer after the tests: %v\n", err)
	}
	if err := stopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: cleaning up after the tests: %v\n", err)
	}
	os.Exit(code)
}

// DatabaseURL returns the URL of this test binary's database, starting a server on first use. It
// fails the test, saying how to provide a server, when none can be had.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	dbURL, _, err := sharedDatabase()
	if err != nil {
		t.Fatal(err)
	}
	return dbURL
}

// Schema is an empty schema of a test's own in the test binary's database.
type Schema struct {
	// Name is an unquoted identifier, t_ followed by random hex.
	Name string
	// URL connects to the database with search_path set to the schema.
	URL string
	// Pool uses URL. It is closed when the test ends.
	Pool *pgxpool.Pool
}

// NewSchema creates a fresh schema and a pool whose connections use it, so a test can create
// tables under their usual names without seeing any other test's. When the test ends the pool is
// closed and the schema dropped with everything in it.
func NewSchema(t testing.TB) *Schema {
	t.Helper()
	schema, drop, err := OpenSchema(context.Background())
	return forTest(t, schema, drop, err)
}

// forTest returns what an Open*Schema opened for t, failing t on err, and closes it (drop) when t
// ends.
func forTest(t testing.TB, schema *Schema, drop func() error, err error) *Schema {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return schema
}

// OpenSchema is NewSchema for code that has no testing.TB, such as a runnable example: the caller
// must call drop, which closes the pool and drops the schema.
func OpenSchema(ctx context.Context) (schema *Schema, drop func() error, err error) {
	dbURL, admin, err := sharedDatabase()
	if err != nil {
		return nil, nil, err
	}
	return openSchemaIn(ctx, dbURL, admin)
}

// openSchemaIn makes a schema in the database dbURL points at, using admin, a pool to it.
func openSchemaIn(ctx context.Context, dbURL string, admin *pgxpool.Pool) (schema *Schema, drop func() error, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	name := "t_" + randomHex(8)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, nil, fmt.Errorf("pgtest: create schema %s: %w", name, err)
	}
	schema, err = schemaPool(ctx, dbURL, name)
	if err != nil {
		return nil, nil, errors.Join(err, dropSchema(admin, name))
	}
	drop = func() error {
		schema.Pool.Close()
		return dropSchema(admin, name)
	}
	return schema, drop, nil
}

// schemaPool returns the Schema of an existing schema, with a new pool.
func schemaPool(ctx context.Context, dbURL, name string) (*Schema, error) {
	// pgx sends URL parameters it does not know as run-time parameters, so every connection made
	// from this URL, by this pool or by the code under test, starts with search_path set, and
	// with an application_name by which checkIn finds the sessions a test leaves behind.
	schemaURL, err := withQueryParam(dbURL, "search_path", name)
	if err == nil {
		schemaURL, err = withQueryParam(schemaURL, "application_name", applicationName(name))
	}
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, schemaURL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: pool for schema %s: %w", name, err)
	}
	return &Schema{Name: name, URL: schemaURL, Pool: pool}, nil
}

// sharedDatabase starts the shared server and database once. A failure is remembered, so every
// test reports the same clear error rather than each retrying a slow start.
func sharedDatabase() (string, *pgxpool.Pool, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.started {
		return shared.dbURL, shared.pool, shared.err
	}
	shared.started = true

	ctx, cancel := context.WithTimeout(context.Background(), sharedStartTimeout)
	defer cancel()
	server, err := Start(ctx, nil)
	if err != nil {
		shared.err = err
		return "", nil, err
	}
	dbURL, err := server.CreateDatabase(ctx, databasePrefix(os.Args[0]))
	if err != nil {
		shared.err = fmt.Errorf("%w (server: %s)", err, server.Kind())
		_ = server.Close()
		return "", nil, shared.err
	}
	poolConfig, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		shared.err = fmt.Errorf("pgtest: parse database URL: %w", err)
		_ = server.Close()
		return "", nil, shared.err
	}
	poolConfig.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		shared.err = fmt.Errorf("pgtest: pool for the test database: %w", err)
		_ = server.Close()
		return "", nil, shared.err
	}
	shared.server, shared.dbURL, shared.pool = server, dbURL, pool
	return dbURL, pool, nil
}

func stopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server == nil {
		return nil
	}
	shared.pool.Close()
	// Close drops the database on an external server; a local or docker one goes away whole.
	err := shared.server.Close()
	shared.server, shared.pool = nil, nil
	shared.err = ErrClosed
	return err
}

// databasePrefix turns a test binary's path, such as /tmp/go-build123/b001/pgstore.test, into a
// database name prefix, such as idem_pgstore, so a database left on a shared server says whose it
// is.
func databasePrefix(binary string) string {
	name := strings.ToLower(filepath.Base(binary))
	name = strings.TrimSuffix(name, ".exe")
	name = strings.TrimSuffix(name, ".test")
	var b strings.Builder
	b.WriteString("idem_")
	for _, r := range name {
		if b.Len() >= 30 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return strings.TrimRight(b.String(), "_")
}

// sharedBouncer is the test binary's pgbouncer, started by the first test that asks.
var sharedBouncer struct {
	mu      sync.Mutex
	started bool
	bouncer *Bouncer
	err     error
}

// BouncedSchema is a migrated schema of a test's own, reached through the test binary's
// pgbouncer in transaction pooling mode.
type BouncedSchema struct {
	// Schema is the schema on a direct connection: its Pool, for setting up and checking.
	*Schema
	// BouncedURL reaches the same schema through the bouncer: a database alias of its own whose
	// server connections have search_path set to the schema (pgbouncer passes none from its
	// clients).
	BouncedURL string
	// Bouncer is the test binary's pgbouncer.
	Bouncer *Bouncer
}

// NewBouncedSchema is NewMigratedSchema behind a pgbouncer in transaction pooling mode (see
// [StartBouncer]), started on first use in front of the test binary's server. When pgbouncer is
// not installed the test is skipped, with a loud note in the test output.
func NewBouncedSchema(t testing.TB) *BouncedSchema {
	t.Helper()
	bouncer := SharedBouncer(t)
	// Not checked in for reuse: the bouncer keeps server connections to it, under its name.
	schema, drop, err := openMigratedSchema(context.Background(), false)
	schema = forTest(t, schema, drop, err)
	dbURL := DatabaseURL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bounced, err := bouncer.AddAlias(ctx, schema.Name, strings.TrimPrefix(u.Path, "/"), schema.Name)
	if err != nil {
		t.Fatal(err)
	}
	return &BouncedSchema{Schema: schema, BouncedURL: bounced, Bouncer: bouncer}
}

// SharedBouncer returns the test binary's pgbouncer, starting it on first use, and skips the test
// loudly when pgbouncer is not installed.
func SharedBouncer(t testing.TB) *Bouncer {
	t.Helper()
	dbURL := DatabaseURL(t)
	sharedBouncer.mu.Lock()
	defer sharedBouncer.mu.Unlock()
	if !sharedBouncer.started {
		sharedBouncer.started = true
		ctx, cancel := context.WithTimeout(context.Background(), sharedStartTimeout)
		defer cancel()
		sharedBouncer.bouncer, sharedBouncer.err = StartBouncer(ctx, dbURL, nil)
	}
	if errors.Is(sharedBouncer.err, ErrNoBouncer) {
		note := noBouncerNote(t.Name(), sharedBouncer.err)
		fmt.Fprint(os.Stderr, note)
		t.Skip(note)
	}
	if sharedBouncer.err != nil {
		t.Fatal(sharedBouncer.err)
	}
	return sharedBouncer.bouncer
}

func stopSharedBouncer() error {
	sharedBouncer.mu.Lock()
	defer sharedBouncer.mu.Unlock()
	if sharedBouncer.bouncer == nil {
		return nil
	}
	err := sharedBouncer.bouncer.Close()
	sharedBouncer.bouncer, sharedBouncer.err = nil, ErrClosed
	return err
}

// noBouncerNote is what a test that needs pgbouncer prints, to the test output and stderr, when
// there is none: loud, so that a run without a pooler is not mistaken for one that tested it.
func noBouncerNote(test string, err error) string {
	bar := strings.Repeat("!", 80)
	return fmt.Sprintf("\n%s\n!!! PGBOUNCER NOT INSTALLED: %s SKIPPED, NOTHING WAS TESTED THROUGH A POOLER.\n!!! %v\n%s\n",
		bar, test, err, bar)
}
