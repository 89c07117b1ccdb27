package pgproxy_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgproxy"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
)

// waitLimit bounds waits for something that must happen, so a broken proxy fails the test
// instead of hanging it. It is never what the test waits for.
const waitLimit = time.Minute

// TestHoldHoldsBothWays holds a statement on its way to the server, then a reply on its way to
// the client, and checks that neither goes anywhere until Resume, and that Close drops the
// connections. The pair of internal/pgtest holds its replication connection so.
func TestHoldHoldsBothWays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	_, err := schema.Pool.Exec(ctx, `CREATE TABLE items (id int PRIMARY KEY)`)
	require.NoError(t, err)
	u, err := url.Parse(schema.URL)
	require.NoError(t, err)
	p, err := pgproxy.Start(ctx, u.Host)
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	u.Host = p.Addr()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()

	config, err := pgx.ParseConfig(u.String())
	require.NoError(t, err)
	locked := make(chan struct{})
	config.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Message == "waiting for the lock" {
			close(locked)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	require.NoError(t, err)
	defer conn.Close(ctx)
	items := func() []int {
		rows, err := schema.Pool.Query(ctx, `SELECT id FROM items ORDER BY id`)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		return ids
	}

	// Towards the server: a held statement does not run.
	_, err = conn.Exec(ctx, `INSERT INTO items VALUES (1)`)
	require.NoError(t, err)
	p.Hold()
	result := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, `INSERT INTO items VALUES (2)`)
		result <- err
	}()
	testfixture.Receive(t, pgproxy.Waiting(p), waitLimit)
	require.Equal(t, []int{1}, items(), "held: the statement went nowhere")
	p.Resume()
	require.NoError(t, testfixture.Receive(t, result, waitLimit), "released: the held statement arrives")
	require.Equal(t, []int{1, 2}, items())

	// Towards the client: a statement the server finishes while held does not answer.
	lock, err := schema.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer lock.Release()
	_, err = lock.Exec(ctx, `SELECT pg_advisory_lock(42)`)
	require.NoError(t, err)
	go func() {
		_, err := conn.Exec(ctx, `DO $$ BEGIN
			RAISE NOTICE 'waiting for the lock';
			PERFORM pg_advisory_lock(42);
			INSERT INTO items VALUES (3);
		END $$`)
		result <- err
	}()
	testfixture.Receive(t, locked, waitLimit)
	select { // a signal from the first hold, if any, says nothing of this one
	case <-pgproxy.Waiting(p):
	default:
	}
	p.Hold()
	_, err = lock.Exec(ctx, `SELECT pg_advisory_unlock(42)`)
	require.NoError(t, err)
	testfixture.Receive(t, pgproxy.Waiting(p), waitLimit)
	require.Equal(t, []int{1, 2, 3}, items(), "the server ran the statement")
	select {
	case err := <-result:
		t.Fatalf("the client got its reply while held (err %v)", err)
	default:
	}
	p.Resume()
	require.NoError(t, testfixture.Receive(t, result, waitLimit), "released: the held reply arrives")

	require.NoError(t, p.Close())
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "closing the proxy drops its connections")
}
