package idemtest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

// waitLimit bounds waits for something that must happen (a fault firing, a
// blocked call returning), so a broken proxy fails the test instead of
// hanging it. It is never what the test waits for.
const waitLimit = 30 * time.Second

// proxied is a schema of a test's own with a proxy in front of its
// database: connect through the proxy, check through direct.
type proxied struct {
	proxy  *idemtest.FaultProxy
	url    string        // the schema's URL, through the proxy
	direct *pgxpool.Pool // the schema, not through the proxy
}

func setupProxy(t *testing.T) *proxied {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	_, err := schema.Pool.Exec(ctx, `
		CREATE TABLE items (id int PRIMARY KEY, note text NOT NULL);
		CREATE TABLE big (id int PRIMARY KEY, payload text NOT NULL)`)
	require.NoError(t, err)

	p, err := idemtest.StartFaultProxy(ctx, schema.URL)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	proxyURL, err := p.URL(schema.URL)
	require.NoError(t, err)
	return &proxied{proxy: p, url: proxyURL, direct: schema.Pool}
}

// connect opens a connection through the proxy, closed when the test ends
// (before the proxy is).
func (b *proxied) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), b.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// items returns the ids in the items table, read directly.
func (b *proxied) items(t *testing.T) []int {
	t.Helper()
	rows, err := b.direct.Query(context.Background(), `SELECT id FROM items ORDER BY id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return ids
}

func waitFired(t *testing.T, f *idemtest.Fault) {
	t.Helper()
	select {
	case <-f.Done():
	case <-time.After(waitLimit):
		t.Fatalf("the fault did not fire within %s (fired %d times)", waitLimit, f.Fired())
	}
}

func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	return testfixture.Receive(t, ch, waitLimit)
}

func TestFaultProxyURL(t *testing.T) {
	t.Parallel()
	p, err := idemtest.StartFaultProxy(context.Background(), "127.0.0.1:1")
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	require.True(t, strings.HasPrefix(p.Addr(), "127.0.0.1:"), p.Addr())

	got, err := p.URL("postgresql://alice:s%40cret@db.example:6543/shop?search_path=s1&sslmode=verify-full&sslrootcert=/ca.pem&application_name=app&host=/var/run/postgresql")
	require.NoError(t, err)
	u, err := url.Parse(got)
	require.NoError(t, err)
	require.Equal(t, "postgresql", u.Scheme)
	require.Equal(t, p.Addr(), u.Host)
	require.Equal(t, "alice", u.User.Username())
	password, _ := u.User.Password()
	require.Equal(t, "s@cret", password)
	require.Equal(t, "/shop", u.Path)
	require.Equal(t, url.Values{"search_path": {"s1"}, "sslmode": {"disable"}, "application_name": {"app"}}, u.Query())

	_, err = p.URL("mysql://root@localhost/db")
	require.ErrorContains(t, err, "not a postgres:// URL")
	_, err = p.URL("postgres://alice:hunter2@[::1/db")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2", "a URL error must not leak the password")

	_, err = idemtest.StartFaultProxy(context.Background(), "postgres:///db?host=/var/run/postgresql")
	require.ErrorContains(t, err, "exactly one TCP host")
	_, err = idemtest.StartFaultProxy(context.Background(), "host=db password=hunter2")
	require.ErrorContains(t, err, "not host:port")
	require.NotContains(t, err.Error(), "hunter2")
}

func TestFaultProxyPassesTraffic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	conn := b.connect(t)

	// A simple-protocol statement is one round trip.
	before := b.proxy.Commands()
	_, err := conn.Exec(ctx, `INSERT INTO items VALUES (1, 'one')`)
	require.NoError(t, err)
	require.Equal(t, int64(1), b.proxy.Commands()-before)

	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT $1::int + 1`, 41).Scan(&n))
	require.Equal(t, 42, n)

	// An error is relayed, and the connection stays usable.
	_, err = conn.Exec(ctx, `SELECT 1/0`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22012", pgErr.Code)

	// A batch of prepared statements is one round trip.
	batch := func(ids ...int) {
		var batch pgx.Batch
		for _, id := range ids {
			batch.Queue(`INSERT INTO items VALUES ($1, $2)`, id, fmt.Sprint("item ", id))
		}
		batch.Queue(`SELECT count(*) FROM items`).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
		require.NoError(t, conn.SendBatch(ctx, &batch).Close())
	}
	batch(2, 3, 4) // prepares the statements
	require.Equal(t, 4, n)
	before = b.proxy.Commands()
	batch(5, 6, 7)
	require.Equal(t, int64(1), b.proxy.Commands()-before)
	require.Equal(t, 7, n)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7}, b.items(t))

	// A pipeline: a result read before its Sync is sent (after a Flush),
	// then two round trips sent together.
	pipeline := conn.PgConn().StartPipeline(ctx)
	next := func() string {
		res, err := pipeline.GetResults()
		require.NoError(t, err)
		switch res := res.(type) {
		case *pgconn.ResultReader:
			r := res.Read()
			require.NoError(t, r.Err)
			return string(r.Rows[0][0])
		case *pgconn.PipelineSync:
			return "sync"
		}
		return fmt.Sprintf("%T", res)
	}
	before = b.proxy.Commands()
	pipeline.SendQueryParams(`SELECT 1`, nil, nil, nil, nil)
	pipeline.SendFlushRequest()
	require.NoError(t, pipeline.Flush())
	require.Equal(t, "1", next())
	for _, sql := range []string{`SELECT 2`, `SELECT 3`} {
		pipeline.SendQueryParams(sql, nil, nil, nil, nil)
		pipeline.SendPipelineSync()
	}
	require.NoError(t, pipeline.Flush())
	require.Equal(t, []string{"2", "sync", "3", "sync"}, []string{next(), next(), next(), next()})
	require.NoError(t, pipeline.Close())
	require.Equal(t, int64(2), b.proxy.Commands()-before)

	// A COPY FROM of several MB, and back.
	var data bytes.Buffer
	for i := 0; data.Len() < 4<<20; i++ {
		fmt.Fprintf(&data, "%d\t%s\n", i, strings.Repeat(string(rune('a'+i%26)), 1000))
	}
	tag, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(data.Bytes()), `COPY big (id, payload) FROM STDIN`)
	require.NoError(t, err)
	require.Equal(t, int64(bytes.Count(data.Bytes(), []byte("\n"))), tag.RowsAffected())
	var back bytes.Buffer
	_, err = conn.PgConn().CopyTo(ctx, &back, `COPY (SELECT id, payload FROM big ORDER BY id) TO STDOUT`)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data.Bytes(), back.Bytes()), "COPY TO returned %d bytes, want the %d sent", back.Len(), data.Len())

	// Messages larger than the proxy's buffers, both ways: a big row, a big
	// parameter, a statement longer than the SQL the proxy inspects.
	var s string
	require.NoError(t, conn.QueryRow(ctx, `SELECT repeat('x', 3 * 1024 * 1024)`).Scan(&s))
	require.Len(t, s, 3<<20)
	require.NoError(t, conn.QueryRow(ctx, `SELECT length($1::text)`, strings.Repeat("y", 3<<20)).Scan(&n))
	require.Equal(t, 3<<20, n)
	_, err = conn.Exec(ctx, `SELECT '`+strings.Repeat("z", 2<<20)+`' AS long`)
	require.NoError(t, err)

	// A pool, with connections in parallel.
	pool, err := pgxpool.New(ctx, b.url)
	require.NoError(t, err)
	defer pool.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			var got int
			err := pool.QueryRow(ctx, `SELECT $1::int FROM pg_sleep(0.01)`, i).Scan(&got)
			if err == nil && got != i {
				err = fmt.Errorf("got %d, want %d", got, i)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestFaultProxyAuthentication runs a cluster of its own whose pg_hba.conf
// asks for passwords, since the test binary's server may trust everyone, and
// logs in through the proxy with SCRAM, MD5 and a cleartext password.
func TestFaultProxyAuthentication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// Readable by the postgres system user, which the cluster runs as when
	// the tests run as root.
	dir, err := os.MkdirTemp("", "idem-faultproxy-hba-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	hba := filepath.Join(dir, "pg_hba.conf")
	require.NoError(t, os.WriteFile(hba, []byte(`
local all all                trust
host  all postgres      127.0.0.1/32 trust
host  all scram_user    127.0.0.1/32 scram-sha-256
host  all md5_user      127.0.0.1/32 md5
host  all password_user 127.0.0.1/32 password
`), 0o644))

	server, err := pgtest.Start(ctx, &pgtest.Options{Mode: pgtest.ModeLocal, Settings: []string{"hba_file=" + hba}})
	if errors.Is(err, pgtest.ErrNoServer) {
		t.Skipf("needs local PostgreSQL binaries to run a cluster with password authentication: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, server.Close()) })

	admin, err := pgx.Connect(ctx, server.AdminURL())
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `
		CREATE ROLE scram_user LOGIN PASSWORD 'scram-pw';
		SET password_encryption = 'md5';
		CREATE ROLE md5_user LOGIN PASSWORD 'md5-pw';
		RESET password_encryption;
		CREATE ROLE password_user LOGIN PASSWORD 'plain-pw'`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))

	p, err := idemtest.StartFaultProxy(ctx, server.AdminURL())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })

	for user, password := range map[string]string{"scram_user": "scram-pw", "md5_user": "md5-pw", "password_user": "plain-pw"} {
		base, err := url.Parse(server.AdminURL())
		require.NoError(t, err)
		base.User = url.UserPassword(user, password)
		through, err := p.URL(base.String())
		require.NoError(t, err)

		conn, err := pgx.Connect(ctx, through)
		require.NoError(t, err, user)
		var got string
		require.NoError(t, conn.QueryRow(ctx, `SELECT current_user`).Scan(&got))
		require.Equal(t, user, got)
		require.NoError(t, conn.Close(ctx))

		base.User = url.UserPassword(user, "wrong")
		through, err = p.URL(base.String())
		require.NoError(t, err)
		_, err = pgx.Connect(ctx, through)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, user)
		require.Equal(t, "28P01", pgErr.Code, user) // invalid_password
	}
}

// TestFaultProxyLosesCommitReply is the lost commit acknowledgement: the
// transaction commits, the client sees an error.
func TestFaultProxyLosesCommitReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	conn := b.connect(t)
	lost := b.proxy.LoseReply(idemtest.Rule{Tag: "COMMIT"})

	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'committed, not acknowledged')`, 1)
	require.NoError(t, err)
	require.Equal(t, 0, lost.Fired())
	require.Error(t, tx.Commit(ctx))
	waitFired(t, lost)
	require.Equal(t, 1, lost.Fired())
	require.True(t, conn.IsClosed(), "the client's connection is reset")

	require.Equal(t, []int{1}, b.items(t), "the server committed")

	// The fault fired once: the next commit goes through.
	conn = b.connect(t)
	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'acknowledged')`, 2)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []int{1, 2}, b.items(t))
}

// TestFaultProxyLosesEachRoundTrip measures the round trips of a
// transaction, then loses each in turn: only losing the COMMIT's reply
// leaves the row committed.
func TestFaultProxyLosesEachRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	insert := func(conn *pgx.Conn, id int) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO items VALUES ($1, 'each')`, id)
			return err
		})
	}

	before := b.proxy.Commands()
	require.NoError(t, insert(b.connect(t), 100))
	trips := int(b.proxy.Commands() - before)
	require.GreaterOrEqual(t, trips, 3, "BEGIN, INSERT (perhaps prepared first) and COMMIT")

	for nth := 1; nth <= trips; nth++ {
		conn := b.connect(t)
		lost := b.proxy.LoseReply(idemtest.Rule{Nth: nth})
		require.Error(t, insert(conn, nth), "round trip %d of %d lost", nth, trips)
		waitFired(t, lost)
		require.True(t, conn.IsClosed())
	}
	require.Equal(t, []int{trips, 100}, b.items(t), "only the transaction whose COMMIT reply was lost committed")
}

func TestFaultProxyLosesReplyBySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	const insert = `INSERT INTO items /* lose-me */ VALUES ($1, 'by sql')`

	// A statement the connection prepared earlier runs with a Bind alone:
	// it is matched all the same.
	conn := b.connect(t)
	_, err := conn.Exec(ctx, insert, 1)
	require.NoError(t, err)
	lost := b.proxy.LoseReply(idemtest.Rule{SQL: "lose-me"})
	_, err = conn.Exec(ctx, `SELECT 'not this one'`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, insert, 2)
	require.Error(t, err)
	waitFired(t, lost)
	require.Equal(t, []int{1, 2}, b.items(t), "the server executed the INSERT whose reply was lost")

	// Preparing a statement executes nothing, so does not match.
	conn = b.connect(t)
	lost = b.proxy.LoseReply(idemtest.Rule{SQL: "lose-me"})
	_, err = conn.Prepare(ctx, "lose", insert)
	require.NoError(t, err)
	require.Equal(t, 0, lost.Fired())
	_, err = conn.Exec(ctx, "lose", 3)
	require.Error(t, err)
	waitFired(t, lost)
	require.Equal(t, []int{1, 2, 3}, b.items(t))
}

func TestFaultProxyRuleCounting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)

	// The 2nd and 3rd INSERT after arming lose their reply; SELECTs do not
	// count.
	lost := b.proxy.LoseReply(idemtest.Rule{Tag: "insert", Nth: 2, Times: 2})
	for id := 1; id <= 4; id++ {
		conn := b.connect(t)
		_, err := conn.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO items VALUES (%d, 'counted')`, id))
		if id == 2 || id == 3 {
			require.Error(t, err, "INSERT %d", id)
		} else {
			require.NoError(t, err, "INSERT %d", id)
		}
	}
	waitFired(t, lost)
	require.Equal(t, 2, lost.Fired())
	require.Equal(t, []int{1, 2, 3, 4}, b.items(t))

	// A round trip sent before arming never matches; a disarmed fault does
	// nothing.
	conn := b.connect(t)
	next := b.proxy.LoseReply(idemtest.Rule{})
	next.Disarm()
	_, err := conn.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	require.Equal(t, 0, next.Fired())
}

func TestFaultProxyStall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	conn := b.connect(t)

	b.proxy.Stall()
	const deadline = 300 * time.Millisecond
	qctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	began := time.Now()
	_, err := conn.Exec(qctx, `SELECT 1`)
	elapsed := time.Since(began)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.GreaterOrEqual(t, elapsed, deadline)
	require.Less(t, elapsed, deadline+waitLimit, "the deadline, not the stall, must end the query")

	// New connections are accepted, and held too.
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	_, err = pgx.Connect(cctx, b.url)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	b.proxy.Resume()
	var n int
	require.NoError(t, b.connect(t).QueryRow(ctx, `SELECT 7`).Scan(&n))
	require.Equal(t, 7, n)
}

// TestFaultProxyStallReply holds the reply of one round trip: the server
// has executed it, the client waits, and gets it after Resume.
func TestFaultProxyStallReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	conn := b.connect(t)

	// Round trip 2: each statement is one (simple protocol, no arguments).
	held := b.proxy.StallReply(idemtest.Rule{Nth: 2})
	result := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, `INSERT INTO items VALUES (1, 'passes')`)
		if err == nil {
			_, err = conn.Exec(ctx, `INSERT INTO items VALUES (2, 'held')`)
		}
		result <- err
	}()
	waitFired(t, held)
	require.Equal(t, []int{1, 2}, b.items(t), "the server executed both statements")
	select {
	case err := <-result:
		t.Fatalf("the client got its reply during the stall (err %v)", err)
	default:
	}

	b.proxy.Resume()
	require.NoError(t, receive(t, result), "the held reply is delivered, not dropped")
	_, err := conn.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
}

// TestFaultProxyRelaysCancelRequest cancels a statement through the proxy,
// once a notice the statement raises says the server is running it.
func TestFaultProxyRelaysCancelRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	config, err := pgx.ParseConfig(b.url)
	require.NoError(t, err)
	sleeping := make(chan struct{})
	config.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Message == "sleeping" {
			close(sleeping)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	require.NoError(t, err)
	defer conn.Close(ctx)

	result := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, `DO $$ BEGIN RAISE NOTICE 'sleeping'; PERFORM pg_sleep(60); END $$`)
		result <- err
	}()
	receive(t, sleeping)
	require.NoError(t, conn.PgConn().CancelRequest(ctx))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, receive(t, result), &pgErr)
	require.Equal(t, "57014", pgErr.Code) // query_canceled
}

// TestFaultProxyRefusesEncryption answers SSLRequest itself, so a client
// that prefers TLS carries on in plaintext.
func TestFaultProxyRefusesEncryption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	q := u.Query()
	q.Set("sslmode", "prefer")
	u.RawQuery = q.Encode()

	conn, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var ssl bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl))
	require.False(t, ssl)

	q.Set("sslmode", "require")
	u.RawQuery = q.Encode()
	_, err = pgx.Connect(ctx, u.String())
	require.Error(t, err, "a client that requires TLS gives up")
}

// blockingReader is the data of a COPY FROM that is in flight: its first
// Read says so, then waits for release.
type blockingReader struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func (r *blockingReader) Read([]byte) (int, error) {
	r.once.Do(func() { close(r.started) })
	<-r.release
	return 0, io.EOF
}

func TestFaultProxyResetAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	idle := b.connect(t)
	busy := b.connect(t)

	data := &blockingReader{started: make(chan struct{}), release: make(chan struct{})}
	result := make(chan error, 1)
	go func() {
		_, err := busy.PgConn().CopyFrom(ctx, data, `COPY items (id, note) FROM STDIN`)
		result <- err
	}()
	receive(t, data.started)
	require.Equal(t, 2, b.proxy.ResetAll())
	close(data.release)
	require.Error(t, receive(t, result), "the COPY in flight fails")

	_, err := idle.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the idle connection was reset too")
	require.Empty(t, b.items(t))

	var n int
	require.NoError(t, b.connect(t).QueryRow(ctx, `SELECT 8`).Scan(&n))
	require.Equal(t, 8, n)
}

func TestFaultProxyLatency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProxy(t)
	conn := b.connect(t)

	const latency = 100 * time.Millisecond
	b.proxy.SetLatency(latency)
	before := b.proxy.Commands()
	began := time.Now()
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT $1::int`, 3).Scan(&n))
	elapsed := time.Since(began)
	trips := b.proxy.Commands() - before
	require.Positive(t, trips)
	require.GreaterOrEqual(t, elapsed, time.Duration(trips)*latency, "%d round trips", trips)

	b.proxy.SetLatency(0)
	require.NoError(t, conn.QueryRow(ctx, `SELECT $1::int`, 4).Scan(&n))
	require.Equal(t, 4, n)
}

// TestFaultProxyCloseEndsEveryGoroutine is not parallel: it counts the
// process's goroutines, which tests running beside it would change. Go
// runs it while the parallel tests wait.
func TestFaultProxyCloseEndsEveryGoroutine(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.DatabaseURL(t)
	baseline := runtime.NumGoroutine()

	p, err := idemtest.StartFaultProxy(ctx, dbURL)
	require.NoError(t, err)
	proxyURL, err := p.URL(dbURL)
	require.NoError(t, err)

	// Connections in every state: closed by the client, mid-startup, held
	// by a stall.
	for range 3 {
		conn, err := pgx.Connect(ctx, proxyURL)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		require.NoError(t, conn.Close(ctx))
	}
	silent, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer silent.Close()
	p.Stall()
	held, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer held.Close()
	_, err = held.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}) // SSLRequest
	require.NoError(t, err)

	require.NoError(t, p.Close())
	// Close has joined every goroutine of the proxy: right after it, none
	// is still at work. One may still be on its way out, past its last
	// deferred call (WaitGroup.Done), not yet reaped by the scheduler.
	require.Empty(t, proxyGoroutinesAtWork(), "goroutines of the proxy still at work after Close")
	// So the count is back to the baseline once those are reaped: yield
	// (never sleep) until it is, or a goroutine leaked elsewhere.
	for deadline := time.Now().Add(waitLimit); runtime.NumGoroutine() > baseline && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	if n := runtime.NumGoroutine(); n > baseline {
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("%d goroutines after Close, %d before the proxy started:\n%s", n, baseline, stacks.String())
	}

	// The proxy closed its side of both (with a reset where it left the
	// client's bytes unread).
	for _, c := range []net.Conn{silent, held} {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(waitLimit)))
		_, err := c.Read(make([]byte, 1))
		require.True(t, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET), "read: %v", err)
	}
	_, err = net.Dial("tcp", p.Addr())
	require.Error(t, err, "the proxy no longer listens")
	require.NoError(t, p.Close(), "a second Close is a no-op")
}

// proxyGoroutinesAtWork returns the stacks of the goroutines still running
// the proxy's code. One whose only frame of the proxy is the function it
// started in, with nothing but the runtime's above it, has returned from its
// last deferred call: it is exiting, and not at work.
func proxyGoroutinesAtWork() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	const pkg = "github.com/go-idem/idem/internal/pgproxy." // where FaultProxy's work is done
	var atWork []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		var funcs []string // innermost first
		for _, line := range strings.Split(g, "\n")[1:] {
			if line == "" || strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "created by ") {
				continue
			}
			if i := strings.LastIndex(line, "("); i > 0 {
				line = line[:i]
			}
			funcs = append(funcs, line)
		}
		if !slices.ContainsFunc(funcs, func(f string) bool { return strings.HasPrefix(f, pkg) }) {
			continue
		}
		i := 0
		for i < len(funcs) && (strings.HasPrefix(funcs[i], "runtime.") || strings.HasPrefix(funcs[i], "sync.")) {
			i++
		}
		if i == len(funcs)-1 && slices.Contains([]string{pkg + "(*Proxy).accept", pkg + "(*Proxy).serve", pkg + "(*Proxy).spawn.func1"}, funcs[i]) {
			continue // exiting
		}
		atWork = append(atWork, g)
	}
	return atWork
}

type ticket struct {
	Seat string `json:"seat"`
}

// TestFaultProxyLosesEachReplyOfAFlow is the proxy's purpose, and the
// example of docs/testing.md: run a request of a two-phase flow through the
// proxy, count its round trips, then lose the reply to each in turn, retry
// like a client after the lease, and check the request took effect once.
func TestFaultProxyLosesEachReplyOfAFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(ctx, `CREATE TABLE tickets (id bigserial PRIMARY KEY, key_id bigint NOT NULL, seat text NOT NULL)`)
	require.NoError(t, err)
	flow := idem.MustNewFlow("tickets.book", []idem.Phase[ticket]{
		{
			Name: "booked",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[ticket]) (idem.Result, error) {
				var id int64
				err := tx.QueryRow(ctx, `INSERT INTO tickets (key_id, seat) VALUES ($1, $2) RETURNING id`, run.Key().ID, run.Input().Seat).Scan(&id)
				return idem.Advance(), errors.Join(err, run.SetCheckpoint("ticket_id", id))
			},
		},
		{
			Name: "responded",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[ticket]) (idem.Result, error) {
				var id int64
				_, err := run.Checkpoint("ticket_id", &id)
				return idem.RespondJSON(http.StatusCreated, map[string]any{"ticket_id": id}), err
			},
		},
	}, nil)

	proxy, err := idemtest.StartFaultProxy(ctx, schema.URL)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, proxy.Close()) })
	proxied, err := proxy.URL(schema.URL)
	require.NoError(t, err)

	clock := idemtest.NewClock(time.Now())
	const lease = 10 * time.Second
	run := func(databaseURL, key string) (*idem.Outcome, error) {
		// A new pool each time: every run starts with empty statement
		// caches, so round trip N is the same statement in every run.
		pool, err := pgxpool.New(ctx, databaseURL)
		require.NoError(t, err)
		defer pool.Close()
		// The control statements (the schema check, marks, heartbeats,
		// re-reads) go straight to the database: the proxy breaks only
		// the request's own round trips.
		store, err := pgstore.New(pool, &pgstore.Config{Schema: schema.Name, ControlDB: schema.Pool})
		require.NoError(t, err)
		runner, err := idem.NewRunner(store, &idem.Config{
			Flows:  []idem.AnyFlow{flow},
			Lease:  lease,
			Logger: slog.New(slog.DiscardHandler),
			Test:   idem.TestConfig{Now: clock.Now},
		})
		require.NoError(t, err)
		return runner.Execute(ctx, flow, idem.Request{Scope: "test", Key: key, Params: ticket{Seat: "12A"}})
	}

	before := proxy.Commands()
	_, err = run(proxied, "measure")
	require.NoError(t, err)
	trips := int(proxy.Commands() - before)
	require.GreaterOrEqual(t, trips, 3)

	resolvedByReading := 0
	for n := 1; n <= trips; n++ {
		key := fmt.Sprint("lost-", n)
		lost := proxy.LoseReply(idemtest.Rule{Nth: n})
		out, err := run(proxied, key)
		waitFired(t, lost)
		if err == nil {
			// The lost reply was a commit's: the runner re-read the key
			// under its fence, found the commit landed, and went on.
			resolvedByReading++
		} else {
			// Retry like a client, from a new process, once the lease ran out.
			clock.Advance(lease + time.Second)
			out, err = run(schema.URL, key)
			require.NoError(t, err, "round trip %d of %d lost", n, trips)
		}
		require.Equal(t, http.StatusCreated, out.Response.Status)

		var tickets int
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM tickets t JOIN idem_keys k ON k.id = t.key_id WHERE k.key = $1`, key).Scan(&tickets))
		require.Equal(t, 1, tickets, "round trip %d of %d lost", n, trips)
	}
	require.Positive(t, resolvedByReading, "losing a phase commit's reply is resolved by reading the key")
}
