package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	// The orphan test re-executes this binary as the parent it then kills.
	if tempDir := os.Getenv(orphanParentEnv); tempDir != "" {
		runOrphanParent(tempDir)
		return
	}
	Main(m)
}

func TestNewSchema(t *testing.T) {
	t.Parallel()

	t.Run("IsolatesTables", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		a, b := NewSchema(t), NewSchema(t)
		require.Regexp(t, `^t_[0-9a-f]{16}$`, a.Name)
		require.NotEqual(t, a.Name, b.Name)

		_, err := a.Pool.Exec(ctx, "CREATE TABLE widgets (id int)")
		require.NoError(t, err)
		require.Equal(t, "widgets", lookupTable(t, a.Pool.QueryRow(ctx, "SELECT to_regclass('widgets')::text")))
		require.Empty(t, lookupTable(t, b.Pool.QueryRow(ctx, "SELECT to_regclass('widgets')::text")))

		// The URL alone carries the schema, for code under test that opens its own connections.
		conn, err := pgx.Connect(ctx, a.URL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var current string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_schema()").Scan(&current))
		require.Equal(t, a.Name, current)
	})

	t.Run("DroppedAtCleanup", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var name string
		t.Run("Owner", func(t *testing.T) {
			schema := NewSchema(t)
			name = schema.Name
			_, err := schema.Pool.Exec(ctx, "CREATE TABLE widgets (id int)")
			require.NoError(t, err)
		})

		conn, err := pgx.Connect(ctx, DatabaseURL(t))
		require.NoError(t, err)
		defer conn.Close(ctx)
		var exists bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", name).Scan(&exists))
		require.False(t, exists, "schema %s outlived its test", name)
	})

	t.Run("ParallelTests", func(t *testing.T) {
		t.Parallel()
		for i := range 8 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				schema := NewSchema(t)
				_, err := schema.Pool.Exec(ctx, "CREATE TABLE items (n int)")
				require.NoError(t, err)
				_, err = schema.Pool.Exec(ctx, "INSERT INTO items VALUES ($1)", i)
				require.NoError(t, err)
				var count int
				require.NoError(t, schema.Pool.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&count))
				require.Equal(t, 1, count)
			})
		}
	})
}

func TestDatabaseURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	dbURL := DatabaseURL(t)
	require.Equal(t, dbURL, DatabaseURL(t), "one database per test binary")

	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var name string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&name))
	require.Regexp(t, `^idem_[a-z0-9_]+_[0-9a-f]{16}$`, name)
}

// lookupTable scans a nullable to_regclass result, "" meaning no such table.
func lookupTable(t *testing.T, row pgx.Row) string {
	t.Helper()
	var name *string
	require.NoError(t, row.Scan(&name))
	if name == nil {
		return ""
	}
	return *name
}

func TestStartWithoutAnySource(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name     string
		opts     *Options
		mentions string
	}{
		{
			name:     "Docker",
			opts:     &Options{Mode: ModeDocker, DockerEndpoint: "unix:///nonexistent/docker.sock"},
			mentions: "set TEST_DATABASE_URL=postgres://",
		},
		{
			name:     "External",
			opts:     &Options{Mode: ModeExternal, URLEnv: "IDEM_PGTEST_NEVER_SET"},
			mentions: "set IDEM_PGTEST_NEVER_SET=postgres://",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Docker's answer comes from the pgdocker helper, which go run builds first: on a cold
			// build cache that takes a minute or more.
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			defer cancel()

			server, err := Start(ctx, tt.opts)
			require.Nil(t, server)
			require.ErrorIs(t, err, ErrNoServer)
			require.NoError(t, ctx.Err(), "Start should give up at once, not wait out its context")
			message := err.Error()
			require.Contains(t, message, tt.mentions)
			require.Contains(t, message, "apt-get install postgresql")
			require.Contains(t, message, "Docker engine")
			require.Contains(t, message, "mode "+string(tt.opts.Mode))
		})
	}
}

func TestStartRejectsUnknownMode(t *testing.T) {
	t.Parallel()
	_, err := Start(context.Background(), &Options{Mode: "podman"})
	require.ErrorIs(t, err, ErrInvalidMode)
	require.Contains(t, err.Error(), "external, local, docker")
}

func TestStartRejectsMalformedSetting(t *testing.T) {
	t.Parallel()
	_, err := Start(context.Background(), &Options{Mode: ModeLocal, Settings: []string{"shared_buffers"}})
	require.ErrorContains(t, err, `server setting "shared_buffers" is not name=value`)
}

// localServiceURL is the machine's own PostgreSQL service, the external server of last resort.
const localServiceURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// externalServerURL returns TEST_DATABASE_URL, or the local service when that answers, or skips.
func externalServerURL(t *testing.T) string {
	t.Helper()
	if url := os.Getenv(DefaultURLEnv); url != "" {
		return url
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, localServiceURL)
	if err != nil {
		t.Skipf("no external server: %s is unset and nothing answers at 127.0.0.1:5432 (%v)", DefaultURLEnv, err)
	}
	_ = conn.Close(ctx)
	return localServiceURL
}

// Not parallel: it uses t.Setenv.
func TestExternalServer(t *testing.T) {
	externalURL := externalServerURL(t)
	const urlEnv = "IDEM_PGTEST_EXTERNAL_FOR_TEST"
	t.Setenv(urlEnv, externalURL)
	ctx := context.Background()

	admin, err := pgx.Connect(ctx, externalURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	databaseExists := func(name string) bool {
		var exists bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists))
		return exists
	}

	server, err := Start(ctx, &Options{Mode: ModeExternal, URLEnv: urlEnv, Logf: t.Logf})
	require.NoError(t, err)
	defer server.Close()
	require.Equal(t, KindExternal, server.Kind())
	require.Equal(t, externalURL, server.AdminURL())

	dbURL, err := server.CreateDatabase(ctx, "ext")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	var name string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_database()").Scan(&name))
	require.Regexp(t, `^ext_[0-9a-f]{16}$`, name)
	// Left open on purpose: WITH (FORCE) must see it off.

	require.ErrorIs(t, server.DropDatabase(ctx, server.AdminURL()), ErrNotCreated,
		"must never drop a database it did not create")
	require.NoError(t, server.DropDatabase(ctx, dbURL))
	require.False(t, databaseExists(name))
	_ = conn.Close(ctx)

	leftURL, err := server.CreateDatabase(ctx, "ext")
	require.NoError(t, err)
	left := strings.TrimPrefix(mustParsePath(t, leftURL), "/")
	require.True(t, databaseExists(left))
	require.NoError(t, server.Close())
	require.False(t, databaseExists(left), "Close drops what CreateDatabase left")
	require.True(t, databaseExists("postgres"))
}

// Not parallel: it uses t.Setenv.
func TestExternalServerDropsAbandonedDatabases(t *testing.T) {
	externalURL := externalServerURL(t)
	const urlEnv = "IDEM_PGTEST_EXTERNAL_FOR_TEST"
	t.Setenv(urlEnv, externalURL)
	ctx := context.Background()

	admin, err := pgx.Connect(ctx, externalURL)
	require.NoError(t, err)
	// A cleanup, not a defer: the databases' own cleanups, registered later, run first and need it.
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	createMarked := func(m marker) string {
		name := "idem_abandoned_" + randomHex(8)
		_, err := admin.Exec(ctx, "CREATE DATABASE "+name)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
		_, err = admin.Exec(ctx, "COMMENT ON DATABASE "+name+" IS "+quoteLiteral(m.String()))
		require.NoError(t, err)
		return name
	}
	databaseExists := func(name string) bool {
		var exists bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists))
		return exists
	}

	self := newMarker()
	deadOwner := self
	deadOwner.pid = deadPID(t)
	expired := self
	expired.created = time.Now().Add(-abandonedAfter - time.Hour)
	orphaned := createMarked(deadOwner)
	old := createMarked(expired)
	live := createMarked(self)

	server, err := Start(ctx, &Options{Mode: ModeExternal, URLEnv: urlEnv, Logf: t.Logf})
	require.NoError(t, err)
	require.NoError(t, server.Close())

	require.False(t, databaseExists(orphaned), "its owner on this host is dead")
	require.False(t, databaseExists(old), "older than %s", abandonedAfter)
	require.True(t, databaseExists(live), "its owner is alive")
}

func TestCreateDatabaseRejectsBadPrefix(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"Upper", "1digit", "has-dash", "quote\"", strings.Repeat("a", 41)} {
		_, err := (&Server{}).CreateDatabase(context.Background(), prefix)
		require.ErrorIs(t, err, ErrInvalidName, prefix)
	}
}

func TestDropDatabaseRejectsURLWithoutDatabase(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "postgres://host:5432", "::not a url"} {
		err := (&Server{}).DropDatabase(context.Background(), bad)
		require.ErrorContains(t, err, "not a URL with a database name", bad)
	}
}

func TestMarkerRoundTrip(t *testing.T) {
	t.Parallel()
	m := marker{host: "build-7", pid: 4242, created: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	parsed, ok := parseMarker(m.String())
	require.True(t, ok)
	require.Equal(t, m, parsed)

	for _, bad := range []string{"", "a comment", "idem-pgtest host=x pid=y created=z", "idem-pgtest host=x pid=1"} {
		_, ok := parseMarker(bad)
		require.False(t, ok, bad)
	}
}

func TestDatabasePrefix(t *testing.T) {
	t.Parallel()
	require.Equal(t, "idem_pgstore", databasePrefix("/tmp/go-build1/b001/pgstore.test"))
	require.Equal(t, "idem_rides", databasePrefix("/x/rides.test.exe"))
	require.Equal(t, "idem_my_pkg_v2", databasePrefix("/x/My-Pkg.v2.test"))
	long := databasePrefix("/x/" + strings.Repeat("z", 80) + ".test")
	require.Len(t, long, 30)
	require.Regexp(t, prefixPattern, long)
}

func mustParsePath(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	return u.Path
}

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

// Not parallel: it uses t.Setenv.
func TestModeFromEnvironment(t *testing.T) {
	ctx := context.Background()

	t.Setenv(ModeEnv, "bogus")
	_, err := Start(ctx, nil)
	require.ErrorIs(t, err, ErrInvalidMode)
	require.Contains(t, err.Error(), ModeEnv+`="bogus"`)

	t.Setenv(ModeEnv, "external")
	_, err = Start(ctx, &Options{URLEnv: "IDEM_PGTEST_NEVER_SET"})
	require.ErrorIs(t, err, ErrNoServer)
	require.Contains(t, err.Error(), "mode external from "+ModeEnv)
	t.Log(err)
}
