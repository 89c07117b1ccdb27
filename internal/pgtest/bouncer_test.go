package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The bouncer pools in transaction mode: a schema's alias reaches the schema, with its
// search_path, and consecutive transactions of one client may land on different server
// connections.
func TestBouncedSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := NewBouncedSchema(t)
	t.Logf("%s on 127.0.0.1:%d", schema.Bouncer.Version(), schema.Bouncer.Port())

	conn, err := pgx.Connect(ctx, schema.BouncedURL+"&default_query_exec_mode=simple_protocol")
	require.NoError(t, err)
	defer conn.Close(ctx)
	var searchPath string
	require.NoError(t, conn.QueryRow(ctx, "SHOW search_path").Scan(&searchPath))
	require.Equal(t, schema.Name, searchPath)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM idem_keys").Scan(&n))
	require.Zero(t, n)

	pools, err := schema.Bouncer.Admin(ctx, "SHOW POOLS")
	require.NoError(t, err)
	found := false
	for _, row := range pools {
		if row[0] == schema.Name {
			found = true
		}
	}
	require.True(t, found, "SHOW POOLS lists the schema's alias: %v", pools)
	config, err := schema.Bouncer.Admin(ctx, "SHOW CONFIG")
	require.NoError(t, err)
	for _, row := range config {
		if row[0] == "pool_mode" {
			require.Equal(t, "transaction", row[1])
		}
	}
}

// A bouncer that exited says how in its log, since a signal leaves no line in pgbouncer's own.
func TestBouncerLogSaysHowItExited(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bouncer, err := StartBouncer(ctx, DatabaseURL(t), t.Logf)
	if errors.Is(err, ErrNoBouncer) {
		t.Skip(noBouncerNote(t.Name(), err))
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, bouncer.Close()) })
	require.NotContains(t, bouncer.Log(), "exited")
	require.NoError(t, bouncer.Kill())
	<-bouncer.exited
	require.False(t, bouncer.Alive())
	require.Contains(t, bouncer.Log(), "exited: signal: killed")
}

// Without a pgbouncer anywhere, findBouncer says so with ErrNoBouncer, which the tests turn into a
// loud skip; a binary named in IDEM_PGBOUNCER that does not exist is an error, not a skip.
func TestNoBouncerIsLoud(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(BouncerEnv, "")
	saved := bouncerDirs
	bouncerDirs = []string{t.TempDir()}
	defer func() { bouncerDirs = saved }()
	_, err := findBouncer()
	require.ErrorIs(t, err, ErrNoBouncer)
	require.ErrorContains(t, err, "apt-get install pgbouncer")
	note := noBouncerNote("TestX", err)
	require.Contains(t, note, "PGBOUNCER NOT INSTALLED: TestX SKIPPED")
	t.Log(note)

	t.Setenv(BouncerEnv, "/nonexistent/pgbouncer")
	_, err = findBouncer()
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrNoBouncer)
}
