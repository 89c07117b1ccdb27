package pgtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// pairTestTimeout bounds a pair test once its pair has started.
const pairTestTimeout = 10 * time.Minute

// An asynchronous pair loses, on failover, what the standby had not received: the rows written
// while replication was held are gone from the new primary, those written before are there, and the
// multi-host URL finds the new primary.
func TestPairAsyncFailoverLosesUnreplicatedCommits(t *testing.T) {
	t.Parallel()
	requireLocalBinaries(t)
	pair := NewPair(t, &PairOptions{Logf: t.Logf})
	ctx, cancel := context.WithTimeout(context.Background(), pairTestTimeout)
	defer cancel()

	primaryPort, standbyPort := urlPort(t, pair.PrimaryURL()), urlPort(t, pair.StandbyURL())
	db := connect(t, pair.URL())
	require.Equal(t, primaryPort, serverPort(t, db), "before a failover the multi-host URL is the primary")
	var syncState string
	require.NoError(t, db.QueryRow(ctx,
		"SELECT sync_state FROM pg_stat_replication WHERE application_name = $1", StandbyApplicationName).Scan(&syncState))
	require.Equal(t, "async", syncState)

	_, err := db.Exec(ctx, "CREATE TABLE rides (id int PRIMARY KEY, written text NOT NULL)")
	require.NoError(t, err)
	_, err = db.Exec(ctx, "INSERT INTO rides SELECT n, 'before' FROM generate_series(1, 5) n")
	require.NoError(t, err)
	require.NoError(t, pair.WaitCaughtUp(ctx))

	standby := connect(t, pair.StandbyURL())
	require.Equal(t, map[string]int{"before": 5}, countRides(t, standby), "the standby has replayed the rows")
	_, err = standby.Exec(ctx, "INSERT INTO rides VALUES (100, 'standby')")
	requirePgError(t, err, "25006") // read_only_sql_transaction: a hot standby is read-only

	pair.HoldReplication()
	for i := 6; i <= 10; i++ {
		_, err := db.Exec(ctx, "INSERT INTO rides VALUES ($1, 'after')", i)
		require.NoError(t, err, "an asynchronous primary commits whatever the standby does")
	}
	require.Equal(t, map[string]int{"before": 5, "after": 5}, countRides(t, db))
	lag, err := pair.Lag(ctx)
	require.NoError(t, err)
	require.Positive(t, lag, "the standby is behind by the held WAL")
	require.Equal(t, map[string]int{"before": 5}, countRides(t, standby), "nothing reached the standby while held")

	require.NoError(t, pair.KillPrimary())
	_, err = pgx.Connect(ctx, pair.PrimaryURL())
	require.Error(t, err, "the killed primary accepts no connections")
	require.NoError(t, pair.Promote(ctx))

	promoted := connect(t, pair.URL())
	require.Equal(t, standbyPort, serverPort(t, promoted), "after the failover the multi-host URL is the promoted standby")
	require.Equal(t, map[string]int{"before": 5}, countRides(t, promoted),
		"the rows committed while replication was held died with the primary")
	_, err = promoted.Exec(ctx, "INSERT INTO rides VALUES (6, 'promoted')")
	require.NoError(t, err, "the new primary accepts writes, even the ids the lost rows had")
	require.Equal(t, map[string]int{"before": 5, "promoted": 1}, countRides(t, promoted))
}

func TestPairOptionsRejectMalformedSettings(t *testing.T) {
	t.Parallel()
	_, err := StartPair(context.Background(), &PairOptions{Settings: []string{"fsync"}})
	require.ErrorContains(t, err, "not name=value")
}

func TestSysVSegment(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "postmaster.pid")
	require.NoError(t, os.WriteFile(path,
		[]byte("4242\n/data\n1700000000\n5432\n/socket\n127.0.0.1\n  5432001    131077\nready   \n"), 0o600))
	id, err := sysVSegment(path)
	require.NoError(t, err)
	require.Equal(t, 131077, id)

	require.NoError(t, os.WriteFile(path, []byte("4242\n/data\n"), 0o600))
	_, err = sysVSegment(path)
	require.Error(t, err)
}

func TestMajorVersion(t *testing.T) {
	t.Parallel()
	require.Equal(t, 15, majorVersion("15.14"))
	require.Equal(t, 16, majorVersion("16beta1"))
	require.Equal(t, 9, majorVersion("9.6.24"))
	require.Equal(t, 0, majorVersion("devel"))
}

// connect opens a connection for the rest of the test.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// serverPort is the port of the server conn is connected to.
func serverPort(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var port int
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT inet_server_port()").Scan(&port))
	return port
}

func urlPort(t *testing.T, url string) int {
	t.Helper()
	config, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	require.Empty(t, config.Fallbacks, "%s names one server", url)
	return int(config.Port)
}

// countRides counts the rides table's rows by their written column.
func countRides(t *testing.T, conn *pgx.Conn) map[string]int {
	t.Helper()
	rows, err := conn.Query(context.Background(), "SELECT written, count(*) FROM rides GROUP BY written")
	require.NoError(t, err)
	counts := map[string]int{}
	for rows.Next() {
		var written string
		var n int
		require.NoError(t, rows.Scan(&written, &n))
		counts[written] = n
	}
	require.NoError(t, rows.Err())
	return counts
}

func requirePgError(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, "%v", err)
}
