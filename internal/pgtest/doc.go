// Package pgtest provides a PostgreSQL server for idem's tests and for the rides demo, on any
// machine that has Go and either a PostgreSQL installation or a Docker engine, with nothing set up
// by hand.
//
// # Where the server comes from
//
// [Start] takes the first source that is available, in this order:
//
//  1. External: the server named by TEST_DATABASE_URL (a postgres:// URL; the variable's name is
//     [Options.URLEnv]). pgtest creates its own uniquely named databases there and drops only those.
//  2. Local: a throwaway cluster run from the local PostgreSQL binaries, found on PATH, through
//     `pg_config --bindir`, or as the highest version under /usr/lib/postgresql/*/bin. It lives in an
//     idem-pgtest-* directory under os.TempDir(), listens on 127.0.0.1 on a free port, trades
//     durability for speed (fsync=off and friends) and is removed by [Server.Close]. The first start
//     runs initdb once into a template cached per PostgreSQL version (idem-pgtemplate-*); later
//     starts copy it, which is several times faster. As root, initdb and postgres run as the postgres
//     system user, because PostgreSQL refuses to run as root.
//  3. Docker: a postgres:15 container, when a Docker engine answers. It is removed by Close, or
//     when the test binary dies, and in any case stops an hour after it started, so a crashed run
//     cannot leak it for longer. The container is run by pgdocker, a small command beside this
//     package in a module of its own, which Start runs with `go run` (the first run builds the
//     Docker client, later ones come from the build cache). That keeps the Docker client out of
//     the library's go.mod, and so out of the module graph of every service that imports idem.
//
// When none is available, Start returns an error wrapping [ErrNoServer] that says how to provide one.
// IDEM_PGTEST_MODE=external|local|docker (or [Options.Mode]) forces a single source.
//
// A crashed or killed test binary leaks nothing for long: on Linux a local server gets SIGQUIT when
// its parent dies, the next local Start removes directories whose owner and postmaster are both
// gone, and the next external Start drops pgtest's databases whose creator, on the same host, is
// gone, or which are more than a day old.
//
// # Pointing the tests at your own server
//
//	TEST_DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go test ./...
//
// The role needs the CREATEDB privilege. Without the variable, installing the PostgreSQL server
// package (apt-get install postgresql) is enough; no service needs to be running.
//
// # In tests
//
// Test packages call [Main] from TestMain, then [DatabaseURL] or [NewSchema] from their tests:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		schema := pgtest.NewSchema(t) // an empty schema of its own; schema.Pool uses it
//		...
//	}
//
// Each test binary gets one server and one database, started on first use; each NewSchema is a
// fresh schema in that database, dropped when the test ends, so parallel tests don't see each
// other's tables.
package pgtest
