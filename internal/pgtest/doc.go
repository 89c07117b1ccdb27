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
//     system user, because PostgreSQL refuses to run as root. See "Who may connect" below.
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
// # Who may connect to a local cluster
//
// Only whoever has its URL. Every connection needs the postgres role's password (scram-sha-256 in
// pg_hba.conf, no trust lines), over TCP and over the Unix socket alike; without it, any account on
// the machine could connect to 127.0.0.1 as a superuser. Each cluster gets a random password of its
// own (16 bytes from crypto/rand), set in single-user mode before the server first listens, and
// given to nobody else on a command line or in a log: it travels only in the URLs pgtest returns
// ([Server.AdminURL], [Server.CreateDatabase], [DatabaseURL], [Schema].URL), so callers need do
// nothing. The cached template's own password was random too, and thrown away when it was made:
// no two clusters share a password, though they share a template. The Unix socket is in a socket
// directory inside the cluster's directory, mode 0700 and owned by the user postgres runs as.
// (Templates from before this, which trusted every local connection, are not reused: the template
// format is part of the cache's name.)
//
// A container started from Docker uses the image's own settings (password "postgres"); it is meant
// for machines with no local binaries.
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
//
// [NewMigratedSchema] is a schema at idem's latest migration. Migrating costs a test hundreds of
// milliseconds of DDL, so, as River's test schemas are, a migrated schema is made once and serves
// test after test: when a test ends, its schema is emptied (the sessions left on it ended, the
// tables, views, functions and types the test added dropped, idem's tables truncated) and kept for
// the binary's next test, provided its catalog then matches a freshly migrated schema's exactly;
// a schema a test migrated down, altered or analyzed is dropped instead. Tests of the migrations
// themselves use NewSchema and migrate it.
//
// # A primary and a standby, for failover tests
//
// [NewPair] (or [StartPair]) starts a primary from the cached template and a streaming standby
// made from it with pg_basebackup, both from the local binaries (a pair has no other source), with
// the standby's replication connection running through a proxy (internal/pgproxy) in the test process:
//
//	pair := pgtest.NewPair(t, &pgtest.PairOptions{Synchronous: false})
//	db, _ := pgxpool.New(ctx, pair.URL()) // follows the primary across a failover
//	pair.HoldReplication()                // the standby falls behind from here
//	... commits that the standby never sees ...
//	pair.KillPrimary()                    // SIGKILL, no shutdown
//	pair.Promote(ctx)                     // the standby is the primary; pair.URL() finds it
//
// # PgBouncer in front of the server
//
// [NewBouncedSchema] is [NewMigratedSchema] reached through a PgBouncer in transaction pooling
// mode ([StartBouncer]), which the test binary starts on first use in front of its server: the
// local pgbouncer binary (Debian's pgbouncer package, found on PATH, in /usr/sbin, or named by
// IDEM_PGBOUNCER), on 127.0.0.1 on a free port, as the postgres user when we are root, with the
// server's password (scram-sha-256) and a database alias per schema whose server connections
// start with search_path set to it (PgBouncer passes no search_path from its clients). When
// pgbouncer is not installed, the test is skipped with a loud note in the test output.
//
// # A Citus cluster
//
// [StartCitus] starts a coordinator and workers (two by default) from the local PostgreSQL
// binaries, found as above, when the citus extension is installed into them: citus.so in the
// server's library directory (what the pg_config beside the binaries says is its --pkglibdir,
// else the bin directory's sibling lib). Each node is a throwaway cluster copied from the cached
// template, with shared_preload_libraries=citus and synchronous_commit=on (a killed worker keeps
// what it acknowledged); the nodes start in parallel, each gets CREATE EXTENSION citus, and the
// coordinator registers itself (citus_set_coordinator_host) and the workers (citus_add_node). All
// nodes share one password, which they read from a password file private to them to connect to
// each other.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) } // also stops the shared Citus cluster
//
//	func TestOnCitus(t *testing.T) {
//		t.Parallel()
//		schema := pgtest.NewCitusSchema(t) // a schema of its own on the test binary's cluster
//		schema.Pool.Exec(ctx, "SELECT create_distributed_table('rides', 'scope')")
//		...
//	}
//
//	func TestWorkerCrash(t *testing.T) {
//		cluster := pgtest.NewCitus(t, nil)  // a cluster of its own: it kills a node
//		w := cluster.Workers()[0]
//		w.Kill()                           // SIGKILL, no shutdown
//		w.Restart(ctx)                     // same port, same data directory
//	}
//
// [SharedCitus] is the test binary's cluster, started on first use and shared by the tests,
// each in a schema of its own ([NewCitusSchema], in the coordinator's postgres database). A test
// that needs a database of its own asks [Citus.CreateDatabase], which creates it on every node
// with the extension in it and registers the nodes in it (Citus's metadata is per database). When
// Citus is not installed, these tests are skipped with a loud note, in the test output and on
// stderr: "NOTE: Citus not installed (no citus.so in <dir>): Citus tests NOT run".
package pgtest
