package idemtest

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/internal/pgtest"
)

// Schema is a throwaway Postgres schema with idem's tables migrated into
// it, for tests and runnable examples: create your own tables in it, point
// pgstore and idemtest at its Pool, and it is emptied of everything in it
// when the test ends (NewSchema) or when you Close it (OpenSchema).
//
// The server comes from the first of: the one TEST_DATABASE_URL names (a
// postgres:// URL of a role with CREATEDB; a database of the test binary's
// own is created there and dropped afterwards), a throwaway cluster run from
// the local PostgreSQL binaries (on PATH, through pg_config, or under
// /usr/lib/postgresql/*/bin: installing the server package is enough, no
// service needs to run), or, from a checkout of idem only, a Docker
// container. One server and one database serve the whole test binary;
// every Schema is a schema of its own in it, so parallel tests do not see
// each other's tables. Migrating is slow, so a Schema is migrated once and
// reused: emptied when its test ends (the sessions left on it ended, the
// tables, views, functions and types you added dropped, idem's tables
// truncated), it serves a later test of the same binary if it is then
// exactly as migrated, and is dropped otherwise.
type Schema struct {
	// Name is the schema's name, an unquoted identifier: t_ and random hex.
	// Pass it as pgstore.Config.Schema, migrations.Config.Schema and
	// Config.Schema, or rely on the search_path, which Pool and URL set.
	Name string
	// URL connects to the database with search_path set to the schema, for
	// code that makes its own pool.
	URL string
	// Pool uses URL. It is closed with the schema.
	Pool *pgxpool.Pool

	closeOnce sync.Once
	drop      func() error
	closeErr  error
}

// NewSchema returns a migrated throwaway schema (see [Schema]) that is
// emptied when t ends. It fails t, saying how to provide a server, when no
// server can be had.
//
//	func TestCreateOrder(t *testing.T) {
//		t.Parallel()
//		schema := NewSchema(t)
//		_, err := schema.Pool.Exec(ctx, ordersDDL)
//		...
//	}
func NewSchema(t testing.TB) *Schema {
	t.Helper()
	s, err := OpenSchema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return s
}

// OpenSchema is NewSchema for code without a testing.TB, such as a runnable
// example: the caller must Close the schema.
func OpenSchema(ctx context.Context) (*Schema, error) {
	s, drop, err := pgtest.OpenMigratedSchema(ctx)
	if err != nil {
		return nil, err
	}
	return &Schema{Name: s.Name, URL: s.URL, Pool: s.Pool, drop: drop}, nil
}

// Close closes the pool and empties the schema of everything in it (see
// [Schema]). Calling it again does nothing.
func (s *Schema) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.drop() })
	return s.closeErr
}

// Main runs the tests of a package that uses NewSchema or OpenSchema, then
// stops the server they used (or drops the database on the server
// TEST_DATABASE_URL names), and exits with the tests' status. Call it from
// TestMain:
//
//	func TestMain(m *testing.M) { Main(m) }
//
// Without it a throwaway cluster still dies with the test binary, and what
// it leaves on disk or on the external server is removed by a later run.
func Main(m *testing.M) { pgtest.Main(m) }
