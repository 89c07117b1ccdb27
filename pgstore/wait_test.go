package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/internal/wirecount"
)

// A channel name fits the 63 bytes Postgres allows, and names its schema.
func TestChannelName(t *testing.T) {
	t.Parallel()
	require.Equal(t, "idem_finished:billing", channel("billing"))
	long := channel(strings.Repeat("s", 63))
	require.LessOrEqual(t, len(long), 63)
	require.Equal(t, "idem_finished:", long[:14])
	require.NotEqual(t, long, channel(strings.Repeat("s", 62)+"t"))
}

// A watch of a key that is gone wakes at once; Close stops the listener,
// and a second Close returns too.
func TestWatchAndCloseTwice(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	st, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	woken, stop := st.WatchKey(t.Context(), idemdriver.Watch{Ref: idemdriver.LockRef{ID: 999, Fence: 1}})
	defer stop()
	select {
	case <-woken:
	case <-time.After(time.Minute):
		t.Fatal("the watch of a key that does not exist never woke")
	}
	st.Close()
	st.Close()
}

// holdKey creates key in store, held for an hour by the database's clock.
func holdKey(t *testing.T, store *Store, key string) idemdriver.LockRef {
	t.Helper()
	res, err := store.Acquire(context.Background(), idemdriver.AcquireParams{Scope: "s", Key: key, Flow: "f", Method: "POST",
		Path: "/", Fingerprints: [][]byte{[]byte{1}}, Params: []byte(`{}`), Lease: time.Hour})
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredCreated, res.Acquired)
	return idemdriver.LockRef{ID: res.Record.ID, Fence: res.Record.Fence, Scope: res.Record.Scope}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Close wakes every waiter of a key still held, returns once the store's
// goroutines have ended, and a watch after Close is woken at once.
func TestCloseWakesWaiters(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	st, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	ref := holdKey(t, st, "k")
	woken, stop := st.WatchKey(t.Context(), idemdriver.Watch{Ref: ref})
	defer stop()
	require.False(t, closed(woken), "the key is held")
	st.Close()
	require.True(t, closed(woken), "Close woke the waiter")
	after, stop2 := st.WatchKey(t.Context(), idemdriver.Watch{Ref: ref})
	defer stop2()
	require.True(t, closed(after), "a watch after Close is woken at once")
}

// A waiter that saw an older fence of the key finds its attempt over at
// once and leaves the current watch alone; a newer fence replaces it.
func TestOlderFenceDoesNotEvictTheWatch(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	st, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	ref := holdKey(t, st, "k")
	current, stop := st.WatchKey(t.Context(), idemdriver.Watch{Ref: ref})
	defer stop()
	old, stopOld := st.WatchKey(t.Context(), idemdriver.Watch{Ref: idemdriver.LockRef{ID: ref.ID, Fence: ref.Fence - 1, Scope: ref.Scope}})
	defer stopOld()
	require.True(t, closed(old), "an older attempt is over")
	require.False(t, closed(current), "the current watch stays")
	newer, stopNewer := st.WatchKey(t.Context(), idemdriver.Watch{Ref: idemdriver.LockRef{ID: ref.ID, Fence: ref.Fence + 1, Scope: ref.Scope}})
	defer stopNewer()
	require.True(t, closed(current), "a newer fence wakes the older watch's waiters")
	require.False(t, closed(newer))
}

// A release that commits while the mark waits for the progress row's lock
// notified nobody (the key was not marked yet): the mark must report the
// attempt over, or its waiters sleep until the recheck.
func TestMarkSeesAReleaseItWaitedFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	st, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	ref := holdKey(t, st, "k")

	tx := pendingRelease(t, st, schema, ref)

	type marked struct {
		over bool
		err  error
	}
	done := make(chan marked, 1)
	go func() {
		over, _, err := st.markWaited(ctx, ref)
		done <- marked{over, err}
	}()
	// The mark waits for the release's lock on the progress row.
	waitsForLock(t, schema, `waited_at = excluded.waited_at`, st.q.leases)
	require.NoError(t, tx.Commit(ctx))
	m := <-done
	require.NoError(t, m.err)
	require.True(t, m.over, "the release committed before the mark took the row: the attempt is over")
}

// Every watched key of a tick is checked with one statement, on the main
// pool: the control pool, which heartbeats use, serves none of it.
func TestWatchesAreCheckedTogetherOnTheMainPool(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	cfg, err := pgxpool.ParseConfig(schema.URL)
	require.NoError(t, err)
	tr := &countingTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := New(pool, &Config{Schema: schema.Name, Wait: WaitPoll})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	const n = 20
	refs := make([]idemdriver.LockRef, n)
	for i := range refs {
		refs[i] = holdKey(t, st, fmt.Sprint("k-", i))
	}
	controlBefore := st.ownControl.Stat().AcquireCount()
	for _, ref := range refs {
		_, stop := st.WatchKey(t.Context(), idemdriver.Watch{Ref: ref})
		defer stop()
	}
	// Each watch checks its key once as it starts, each on its own
	// connection as the pool gives one: on a loaded machine some of those
	// come after the checker's first ticks. Wait for all of them, then for
	// ticks after them, which must check the keys together only.
	require.Eventually(t, func() bool { return tr.count(st.q.waitCheck) >= n }, time.Minute, 5*time.Millisecond)
	ticks := tr.count(st.q.waitCheckAll)
	require.Eventually(t, func() bool { return tr.count(st.q.waitCheckAll) >= ticks+3 }, time.Minute, 5*time.Millisecond)
	require.Equal(t, n, tr.count(st.q.waitCheck), "one check per key when its watch starts, none per key after")
	require.Equal(t, controlBefore, st.ownControl.Stat().AcquireCount(), "nothing on the control pool")
}

// countingTracer counts the statements sent, by their text.
type countingTracer struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]int{}
	}
	c.seen[d.SQL]++
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts each statement of a batch (a phase's BEGIN
// pipeline).
func (c *countingTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		ctx = c.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: q.SQL})
	}
	return ctx
}

func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (c *countingTracer) count(sql string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[sql]
}

// A listener that cannot connect says so at warn, once, and the watches
// poll meanwhile: a key watched then is not marked (nobody would hear its
// notification) and its waiters are woken all the same.
func TestListenerDownIsLoggedAndPolled(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	lc, err := pgx.ParseConfig(schema.URL)
	require.NoError(t, err)
	lc.Host, lc.Port = "127.0.0.1", 1 // nothing listens there
	logs := &testfixture.Buffer{}
	st, err := New(schema.Pool, &Config{Schema: schema.Name, Wait: WaitListen(lc),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	first := holdKey(t, st, "first")
	_, stop := st.WatchKey(t.Context(), idemdriver.Watch{Ref: first})
	defer stop()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "cannot LISTEN") }, time.Minute, 5*time.Millisecond)
	require.Contains(t, logs.String(), "level=WARN")
	require.False(t, st.waitsNow().Listening)

	ref := holdKey(t, st, "second")
	woken, stop2 := st.WatchKey(t.Context(), idemdriver.Watch{Ref: ref})
	defer stop2()
	require.NoError(t, st.Release(context.Background(), ref, "failed"))
	select {
	case <-woken:
	case <-time.After(time.Minute):
		t.Fatal("the watch did not poll while the listener was down")
	}
	var marked bool
	require.NoError(t, schema.Pool.QueryRow(context.Background(),
		`SELECT coalesce((SELECT waited_at IS NOT NULL FROM idem_leases WHERE scope = $1 AND key_id = $2), false)`, ref.Scope, ref.ID).Scan(&marked))
	require.False(t, marked, "no mark while nobody listens")
	require.Equal(t, 1, strings.Count(logs.String(), "cannot LISTEN"), "rate-limited")
}

// The listener connects with the pool's configuration and its
// BeforeConnect hook.
func TestListenerRunsBeforeConnect(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	cfg, err := pgxpool.ParseConfig(schema.URL)
	require.NoError(t, err)
	cfg.BeforeConnect = func(_ context.Context, c *pgx.ConnConfig) error {
		c.RuntimeParams["application_name"] = "hooked"
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := New(pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	_, stop := st.WatchKey(t.Context(), idemdriver.Watch{Ref: holdKey(t, st, "k")})
	defer stop()
	require.Eventually(t, func() bool { return st.waitsNow().Listening }, time.Minute, 5*time.Millisecond)
	var app string
	require.NoError(t, schema.Pool.QueryRow(context.Background(),
		`SELECT application_name FROM pg_stat_activity WHERE query = 'LISTEN ' || quote_ident($1)`, channel(schema.Name)).Scan(&app))
	require.Equal(t, "hooked", app)
}

// A key whose lease ran out by the database's clock wakes a new watch by
// its mark, for a waiter to take the key over; a lapsed watch (its waiter
// found the same attempt still holding the key: the waiter's clock is
// behind) is woken only at a check of the store's loop, never by its mark,
// so that its waiter acquires once per tick instead of in a loop.
func TestLapsedWatchWakesAtTheNextCheck(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	cfg, err := pgxpool.ParseConfig(schema.URL)
	require.NoError(t, err)
	counter := wirecount.Install(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := New(pool, &Config{Schema: schema.Name, Wait: WaitPoll})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	past := time.Now().Add(-2 * time.Hour)
	expired := func(key string) idemdriver.LockRef {
		res, err := st.Acquire(context.Background(), idemdriver.AcquireParams{Scope: "s", Key: key, Flow: "f", Method: "POST",
			Path: "/", Fingerprints: [][]byte{make([]byte, 33)}, Params: []byte(`{}`), Lease: time.Hour, Now: &past})
		require.NoError(t, err)
		return idemdriver.LockRef{ID: res.Record.ID, Fence: res.Record.Fence, Scope: "s"}
	}
	checks := func(from wirecount.Position) int {
		n := 0
		for _, sql := range counter.Between(from, counter.Position()).Statements {
			if strings.Contains(sql, "unnest(") {
				n++
			}
		}
		return n
	}
	for _, lapsed := range []bool{false, true} {
		ref := expired(fmt.Sprint("k-", lapsed))
		from := counter.Position()
		woken, stop := st.WatchKey(t.Context(), idemdriver.Watch{Ref: ref, Lapsed: lapsed})
		select {
		case <-woken:
		case <-time.After(time.Minute):
			t.Fatalf("lapsed %v: never woken", lapsed)
		}
		stop()
		if lapsed {
			require.Positive(t, checks(from), "a lapsed watch is woken by a check of the loop")
		} else {
			require.Zero(t, checks(from), "a watch of a lease run out is woken by its mark, at once")
		}
	}
}

// A watch woken, or left by its waiters, while its mark runs lets the mark
// finish: cancelling it would send a cancel request, a connection of its
// own to the server (through a pooler, a server connection) to stop a
// statement that takes a round trip, and PgBouncer 1.18 exits (FATAL
// "bad client state") when a cancel's client hangs up before the cancel
// was forwarded, which pgx does once the statement it cancels returns.
func TestLeavingAWatchSendsNoCancelRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	cfg, err := pgxpool.ParseConfig(schema.URL)
	require.NoError(t, err)
	cancels := pgtest.CountCancelRequests(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := New(pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	ref := holdKey(t, st, "k")

	// A release, not committed yet, holds the progress row the mark updates.
	tx := pendingRelease(t, st, schema, ref)

	_, stop := st.WatchKey(t.Context(), idemdriver.Watch{Ref: ref})
	waitsForLock(t, schema, `waited_at = excluded.waited_at`, st.q.leases, "the mark waits for the release's lock")
	stop() // its only waiter leaves
	require.NoError(t, tx.Commit(ctx))
	require.Eventually(t, func() bool {
		var running bool
		err := schema.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%waited_at = excluded.waited_at%' AND strpos(query, $1) > 0)`, st.q.leases).Scan(&running)
		return err == nil && !running
	}, time.Minute, 5*time.Millisecond, "the mark finished")
	require.Zero(t, cancels.Load(), "no cancel request for the mark of a watch nobody waits on")
}

// A finish at read committed that waited for the key's row while a waiter's
// mark held it (FOR SHARE) sees the mark once it gets the row, and
// notifies: the finishing statement wakes the waiters itself (no trigger),
// reading the mark with a snapshot newer than its own. And a finish of a
// key nobody marked sends nothing.
func TestFinishNotifiesAMarkThatCommittedWhileItWaited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, schema := plainStore(t, &Config{Wait: WaitPoll})
	listener := listenForWaiters(t, schema)

	finish := func(ref idemdriver.LockRef) error {
		tx, err := st.BeginPhase(ctx, idemdriver.PhaseOptions{Isolation: pgx.ReadCommitted})
		if err != nil {
			return err
		}
		return tx.CommitPhase(ctx, idemdriver.CommitParams{Ref: ref, Status: idemtype.StoredFinished,
			Response: &idemtype.Response{Status: 201}, Retention: time.Hour})
	}
	unmarked := holdKey(t, st, "unmarked")
	require.NoError(t, finish(unmarked))

	ref := holdKey(t, st, "k")
	mark := pendingMark(t, st, schema, ref)

	finished := make(chan error, 1)
	go func() { finished <- finish(ref) }()
	// The finish waits for the mark's lock on the progress row.
	waitsForLock(t, schema, `finished_at`, st.q.table)
	require.NoError(t, mark.Commit(ctx))
	require.NoError(t, <-finished)

	// A bound for a notification that never comes, not a timing: it is
	// sent at the finish's commit, before finish returned.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n, err := listener.Conn().WaitForNotification(wctx)
	require.NoError(t, err, "the finish notified nobody")
	require.Equal(t, fmt.Sprint(ref.ID), n.Payload, "the marked key, not the unmarked one")
}

// pendingRelease releases ref in a transaction it leaves open (rolled back
// at the test's end), so the key's progress row stays locked by a release
// nobody has seen yet.
func pendingRelease(t *testing.T, st *Store, schema *pgtest.Schema, ref idemdriver.LockRef) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var matched int
	require.NoError(t, tx.QueryRow(ctx, st.q.release, ref.ID, ref.Fence, "failed", ref.Scope).Scan(&matched))
	require.Equal(t, 1, matched)
	return tx
}

// A release (or a parking) that waits for a waiter's mark to commit must
// unlock the lease row the mark made: the key had none when the release's
// statement began, so an update of the lease rows its snapshot sees misses
// it, and the key would read as held (and its waiter stay asleep) until the
// first lease ran out.
func TestUnlockMeetsTheLeaseRowAMarkMadeWhileItWaited(t *testing.T) {
	t.Parallel()
	for name, unlock := range map[string]func(st *Store, ref idemdriver.LockRef) error{
		"release": func(st *Store, ref idemdriver.LockRef) error {
			return st.Release(context.Background(), ref, "failed")
		},
		"set needs_reconcile": func(st *Store, ref idemdriver.LockRef) error {
			return st.SetNeedsReconcile(context.Background(), ref, "in doubt")
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st, schema := plainStore(t, &Config{Wait: WaitPoll})
			listener := listenForWaiters(t, schema)

			ref := holdKey(t, st, "k")
			mark := pendingMark(t, st, schema, ref)

			unlocked := make(chan error, 1)
			go func() { unlocked <- unlock(st, ref) }()
			// The unlock waits for the mark's lock on the progress row.
			waitsForLock(t, schema, `last_error = left($3, 4000)`, st.q.table)
			require.NoError(t, mark.Commit(ctx))
			require.NoError(t, <-unlocked)

			rec, err := st.GetKey(ctx, ref.Scope, "k")
			require.NoError(t, err)
			require.Nil(t, rec.LockedAt, "the key was unlocked: nobody holds it")
			over, _, err := st.checkWaited(ctx, ref)
			require.NoError(t, err)
			require.True(t, over, "the waited-for attempt is over")

			// A bound for a notification that never comes, not a timing: it
			// is sent at the unlock's commit, before unlock returned.
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			n, err := listener.Conn().WaitForNotification(wctx)
			require.NoError(t, err, "the unlock notified nobody")
			require.Equal(t, fmt.Sprint(ref.ID), n.Payload)
		})
	}
}

// The same for a heartbeat that makes the lease row after the release's
// statement began (it waits here for a waiter's lock on the progress row,
// which a heartbeat does not wait for): the lease row the heartbeat
// renewed is unlocked, not left held for another lease.
func TestReleaseMeetsTheLeaseRowAHeartbeatMadeWhileItWaited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, schema := plainStore(t, &Config{Wait: WaitPoll})
	ref := holdKey(t, st, "k")

	waiter, err := schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = waiter.Rollback(ctx) }()
	_, err = waiter.Exec(ctx, `SELECT 1 FROM `+st.q.table+` WHERE scope = $1 AND id = $2 FOR SHARE`, ref.Scope, ref.ID)
	require.NoError(t, err)

	released := make(chan error, 1)
	go func() { released <- st.Release(ctx, ref, "failed") }()
	waitsForLock(t, schema, `last_error = left($3, 4000)`, st.q.table)
	_, err = st.Heartbeat(ctx, ref, time.Hour, nil)
	require.NoError(t, err, "the heartbeat makes the lease row")
	require.NoError(t, waiter.Commit(ctx))
	require.NoError(t, <-released)

	rec, err := st.GetKey(ctx, ref.Scope, "k")
	require.NoError(t, err)
	require.Nil(t, rec.LockedAt, "the key was released: nobody holds it")
}

// waitsForLock returns once a statement containing text and the name of
// table waits for a lock (msgAndArgs as require's).
func waitsForLock(t *testing.T, schema *pgtest.Schema, text, table string, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		err := schema.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND strpos(query, $2) > 0 AND strpos(query, $1) > 0)`, table, text).Scan(&waiting)
		return err == nil && waiting
	}, time.Minute, 5*time.Millisecond, msgAndArgs...)
}

// listenForWaiters is a connection that listens on the schema's channel,
// released at the test's end.
func listenForWaiters(t *testing.T, schema *pgtest.Schema) *pgxpool.Conn {
	t.Helper()
	listener, err := schema.Pool.Acquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(listener.Release)
	_, err = listener.Exec(context.Background(), `LISTEN `+pgx.Identifier{channel(schema.Name)}.Sanitize())
	require.NoError(t, err)
	return listener
}

// pendingMark marks ref as waited for in a transaction it leaves open
// (rolled back at the test's end), so the key's progress row stays locked
// FOR SHARE by a mark nobody has seen yet.
func pendingMark(t *testing.T, st *Store, schema *pgtest.Schema, ref idemdriver.LockRef) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var over bool
	var left float64
	require.NoError(t, tx.QueryRow(ctx, st.q.waitMark, ref.ID, ref.Fence, ref.Scope).Scan(&over, &left))
	require.False(t, over)
	return tx
}
