package idem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/hooks"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/internal/wirecount"
	"github.com/go-idem/idem/pgstore"
)

// waitBench is a ride flow whose first charge blocks until released (and
// then fails, when told to), and a runner on the database's clock that
// counts the in-progress answers.
type waitBench struct {
	*testBundle
	runner     *idem.Runner
	pause      *testfixture.Pause // holds the first charge
	fail       atomic.Bool
	inProgress chan struct{}
}

func setupWait(t *testing.T, wrap func(idemdriver.Store) idemdriver.Store) *waitBench {
	t.Helper()
	return setupWaitOn(t, setup(t), wrap)
}

// setupWaitOn is setupWait on a bundle the caller made (through a pooler,
// say).
func setupWaitOn(t *testing.T, tb *testBundle, wrap func(idemdriver.Store) idemdriver.Store) *waitBench {
	t.Helper()
	return setupWaitWith(t, tb, wrap, nil)
}

// setupWaitWith is setupWaitOn with the runner's configuration tuned.
func setupWaitWith(t *testing.T, tb *testBundle, wrap func(idemdriver.Store) idemdriver.Store, tune func(*idem.Config)) *waitBench {
	t.Helper()
	b := &waitBench{testBundle: tb, pause: testfixture.NewPause(t), inProgress: make(chan struct{}, 16)}
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		if b.pause.Hold(context.Background()) && b.fail.Load() {
			return errors.New("provider down")
		}
		return nil
	}
	var store idemdriver.Store = b.storeFor(t)
	if wrap != nil {
		store = wrap(store)
	}
	cfg := &idem.Config{Flows: []idem.AnyFlow{b.flow},
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventInProgress {
				select {
				case b.inProgress <- struct{}{}:
				default:
				}
			}
		})}
	if tune != nil {
		tune(cfg)
	}
	r, err := idem.NewRunner(store, cfg)
	require.NoError(t, err)
	b.runner = r
	return b
}

type result struct {
	out *idem.Outcome
	err error
}

func (b *waitBench) execute(key string, wait time.Duration) <-chan result {
	return b.executeWaiting(key, wait, nil)
}

// executeWaiting is execute with the request's WaitContext.
func (b *waitBench) executeWaiting(key string, wait time.Duration, waitCtx context.Context) <-chan result {
	done := make(chan result, 1)
	go func() {
		req := b.request(key, rideInput{Origin: "here", Amount: 12})
		req.Wait, req.WaitContext = wait, waitCtx
		out, err := b.runner.Execute(context.Background(), b.flow, req)
		done <- result{out, err}
	}()
	return done
}

// A request with Wait that finds its key in flight waits for it and gets
// its stored response, with a store that listens and with one that polls
// (pgstore.WaitPoll).
func TestWaitGetsTheStoredResponse(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgstore.Wait{pgstore.WaitAuto, pgstore.WaitPoll} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			st, err := pgstore.New(tb.schema.Pool, &pgstore.Config{Schema: tb.schema.Name, Wait: mode})
			require.NoError(t, err)
			t.Cleanup(st.Close)
			tb.store = st
			b := setupWaitOn(t, tb, nil)
			first := b.execute("k-1", 0)
			<-b.pause.Reached()
			waiter := b.execute("k-1", time.Minute)
			<-b.inProgress
			b.pause.Release()
			one, two := <-first, <-waiter
			require.NoError(t, one.err)
			require.Equal(t, idem.OutcomeExecuted, one.out.Kind)
			require.NoError(t, two.err)
			require.Equal(t, idem.OutcomeReplayed, two.out.Kind)
			require.Equal(t, one.out.Response.Body, two.out.Response.Body)
			require.Positive(t, two.out.Waited)
			require.Equal(t, 1, b.provider.Charges(), "charged once")
		})
	}
}

// A wait that passes before the attempt in flight ends gets ErrInProgress,
// saying it waited.
func TestWaitPasses(t *testing.T) {
	t.Parallel()
	b := setupWait(t, nil)
	first := b.execute("k-1", 0)
	<-b.pause.Reached()
	began := time.Now()
	r := <-b.execute("k-1", 2*time.Second)
	require.GreaterOrEqual(t, time.Since(began), 2*time.Second)
	require.ErrorIs(t, r.err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, r.out.Kind)
	require.Positive(t, r.out.Waited)
	require.Positive(t, r.out.RetryAfter)
	b.pause.Release()
	require.NoError(t, (<-first).err)
}

// An attempt that fails while a request waits releases the key: the waiter
// gets what a retry arriving then gets, the key taken over and resumed.
func TestWaitAfterAFailure(t *testing.T) {
	t.Parallel()
	b := setupWait(t, nil)
	b.fail.Store(true)
	first := b.execute("k-1", 0)
	<-b.pause.Reached()
	waiter := b.execute("k-1", time.Minute)
	<-b.inProgress
	b.pause.Release()
	one, two := <-first, <-waiter
	require.Equal(t, idem.OutcomeFailed, one.out.Kind)
	require.NoError(t, two.err)
	require.Equal(t, idem.OutcomeExecuted, two.out.Kind)
	require.True(t, two.out.TookOver)
	require.Positive(t, two.out.Waited)
	require.Equal(t, 1, b.countRows(t, "rides"), "the ride the first attempt made, resumed")
}

// Through PgBouncer in transaction mode, where a LISTEN would be lost, the
// store finds the pooler and polls: the waiter gets the stored response,
// and the store received no notification.
func TestWaitThroughPgBouncerPolls(t *testing.T) {
	t.Parallel()
	b := setupWaitOn(t, setupBounced(t, pgx.QueryExecModeExec), nil)
	first := b.execute("k-1", 0)
	<-b.pause.Reached()
	waiter := b.execute("k-1", time.Minute)
	<-b.inProgress
	b.pause.Release()
	one, two := <-first, <-waiter
	require.NoError(t, one.err)
	require.NoError(t, two.err)
	require.Equal(t, idem.OutcomeReplayed, two.out.Kind)
	require.Equal(t, one.out.Response.Body, two.out.Response.Body)
	require.Positive(t, two.out.Waited)
	require.Eventually(t, func() bool { return hooks.StoreWaits(b.store).Polling }, time.Minute, 5*time.Millisecond, "the listener found the pooler: the store polls")
	require.False(t, hooks.StoreWaits(b.store).Listening)
	require.Zero(t, hooks.StoreWaits(b.store).Notifications, "no LISTEN through a transaction pooler")
	require.Equal(t, 1, b.provider.Charges())
}

// deafWatcher is a store whose WatchKey never wakes anyone: a wake-up
// lost.
type deafWatcher struct{ idemdriver.Store }

func (deafWatcher) WatchKey(context.Context, idemdriver.Watch) (<-chan struct{}, func()) {
	return make(chan struct{}), func() {}
}

// A waiter whose wake-up never comes acquires the key once more when its
// wait passes, and gets the stored response rather than a 409.
func TestWaitAcquiresOnceMoreAtItsEnd(t *testing.T) {
	t.Parallel()
	b := setupWait(t, func(s idemdriver.Store) idemdriver.Store { return deafWatcher{s} })
	first := b.execute("k-1", 0)
	<-b.pause.Reached()
	waiter := b.execute("k-1", 2*time.Second)
	<-b.inProgress
	b.pause.Release()
	one := <-first
	require.NoError(t, one.err)
	two := <-waiter
	require.NoError(t, two.err, "acquired once more at the wait's end")
	require.Equal(t, idem.OutcomeReplayed, two.out.Kind)
	require.Equal(t, one.out.Response.Body, two.out.Response.Body)
	require.GreaterOrEqual(t, two.out.Waited, time.Second)
}

// A finishing phase at repeatable read or serializable reads the marks
// with its snapshot: a waiter that marks the key while that phase runs is
// still notified (the store notifies once more after the commit), well
// before the watch's own recheck.
func TestWaitWakesAfterAFinishAtRepeatableRead(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			b := setupWaitWith(t, setup(t), nil, func(c *idem.Config) { c.Isolation = iso })
			b.hooks["charge_created"] = nil
			pause := testfixture.NewPause(t)
			b.hooks["receipt_enqueued"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
				// The phase's snapshot is taken by its first statement.
				if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
					return err
				}
				pause.Hold(context.Background())
				return nil
			}
			first := b.execute("k-1", 0)
			<-pause.Reached()
			waiter := b.execute("k-1", time.Minute)
			<-b.inProgress
			require.Eventually(t, func() bool {
				var marked bool
				err := b.pool.QueryRow(context.Background(), `SELECT waited_at IS NOT NULL FROM idem_leases`).Scan(&marked)
				return err == nil && marked && hooks.StoreWaits(b.store).Listening
			}, 10*time.Second, 5*time.Millisecond, "the waiter marks the key while the last phase runs, and its store listens")
			pause.Release()
			one, two := <-first, <-waiter
			require.NoError(t, one.err)
			require.NoError(t, two.err)
			require.Equal(t, idem.OutcomeReplayed, two.out.Kind)
			require.Positive(t, hooks.StoreWaits(b.store).Notifications, "woken by a notification, not by the 5 s recheck")
			t.Logf("%s: woken after %s", iso, two.out.Waited)
		})
	}
}

// WaitContext ending stops the waiting at once (ErrInProgress), without
// touching the attempt in flight.
func TestWaitContextEndsTheWait(t *testing.T) {
	t.Parallel()
	b := setupWait(t, nil)
	first := b.execute("k-1", 0)
	<-b.pause.Reached()
	ctx, cancel := context.WithCancel(context.Background())
	waiter := b.executeWaiting("k-1", time.Hour, ctx)
	<-b.inProgress
	cancel()
	r := <-waiter
	// It ended while the first attempt is still held (opened only below),
	// not after the hour it asked for.
	require.ErrorIs(t, r.err, idem.ErrInProgress)
	b.pause.Release()
	one := <-first
	require.NoError(t, one.err)
	require.Equal(t, idem.OutcomeExecuted, one.out.Kind)
}

// idem_notify_waiters notifies the schema's channel with the key's id
// only for a key a waiter marked, and only when the transaction commits.
func TestNotifyWaitersOnlyForMarkedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	r := b.runner(t, nil)
	for _, key := range []string{"k-1", "k-2"} {
		_, err := r.Execute(ctx, b.flow, b.request(key, rideInput{Origin: "here", Amount: 1}))
		require.NoError(t, err)
	}
	listener, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(ctx, `LISTEN "idem_finished:`+b.schema.Name+`"`)
	require.NoError(t, err)
	var id1, id2 int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT (SELECT id FROM idem_keys WHERE key = 'k-1'), (SELECT id FROM idem_keys WHERE key = 'k-2')`).Scan(&id1, &id2))
	_, err = b.pool.Exec(ctx, `INSERT INTO idem_leases (scope, key_id, fence, waited_at)
		SELECT scope, id, fence, now() FROM idem_keys WHERE scope = $1 AND id = $2
		ON CONFLICT (scope, key_id) DO UPDATE SET waited_at = excluded.waited_at`, "user:1", id2)
	require.NoError(t, err)

	notify := func(id int64, commit bool) bool {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		var sent bool
		require.NoError(t, tx.QueryRow(ctx, `SELECT idem_notify_waiters($1, $2)`, "user:1", id).Scan(&sent))
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		return sent
	}
	require.False(t, notify(id1, true), "nobody waits for k-1")
	require.True(t, notify(id2, false), "rolled back: sent nothing")
	require.True(t, notify(id2, true))
	n, err := listener.Conn().WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "idem_finished:"+b.schema.Name, n.Channel)
	require.Equal(t, fmt.Sprint(id2), n.Payload, "the key's id, not the key")
	// Nothing else came: a round trip receives what is pending, and a
	// wait that may not block finds nothing.
	require.NoError(t, listener.Ping(ctx))
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = listener.Conn().WaitForNotification(done)
	require.ErrorIs(t, err, context.Canceled)
}

// countingWatcher counts the runner's calls of WatchKey: one per waiter
// that started waiting.
type countingWatcher struct {
	idemdriver.Store
	n atomic.Int64
}

func (c *countingWatcher) WatchKey(ctx context.Context, w idemdriver.Watch) (<-chan struct{}, func()) {
	c.n.Add(1)
	return c.Store.WatchKey(ctx, w)
}

// Two thousand requests of a process waiting for one key in flight cost its
// pool one statement per tick of the store's wait loop (one check of every
// watched key), not one per waiter; a request beyond Config.MaxWaiters is
// answered in progress at once; and when the attempt ends every waiter gets
// its response. Another tenant's request while they wait is timed against
// one without them, and logged: timing targets live in benchmarks.
func TestTwoThousandWaitersCostOneStatementPerTick(t *testing.T) {
	t.Parallel()
	const waiters = 2000
	tb := setup(t)
	cfg, err := pgxpool.ParseConfig(tb.schema.URL)
	require.NoError(t, err)
	counter := wirecount.Install(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Polling, the costlier mode: a listening store checks a watched key
	// only every 5 s and at its lease's expiry. Heartbeats go through an
	// uncounted control pool.
	st, err := pgstore.New(pool, &pgstore.Config{Schema: tb.schema.Name, Wait: pgstore.WaitPoll, ControlDB: tb.schema.Pool})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	tb.store = st
	watching := &countingWatcher{}
	b := setupWaitWith(t, tb, func(s idemdriver.Store) idemdriver.Store {
		watching.Store = s
		return watching
	}, func(c *idem.Config) {
		c.MaxWaiters = waiters
		// The 2,000 requests arrive at once and each acquires the key once
		// before it waits: their acquisitions queue for the pool's few
		// connections, which on a loaded test machine, under the race
		// detector, takes longer than the default 5 s.
		c.StatementTimeout = 2 * time.Minute
	})
	ctx := context.Background()
	// otherTenant is the median time of five new keys of another tenant.
	otherTenant := func(prefix string) time.Duration {
		var took []time.Duration
		for i := range 5 {
			began := time.Now()
			req := b.request(fmt.Sprint(prefix, i), rideInput{Origin: "there", Amount: 3})
			req.Scope = "user:2"
			out, err := b.runner.Execute(ctx, b.flow, req)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out.Kind)
			took = append(took, time.Since(began))
		}
		slices.Sort(took)
		return took[len(took)/2]
	}
	first := b.execute("k-1", 0)
	<-b.pause.Reached()
	// The first request holds k-1 in its charge (the bench's hook pauses
	// the first charge only): another tenant's request, with nobody waiting.
	otherTenant("warm-up")
	alone := otherTenant("alone")
	began := counter.Position()
	results := make([]<-chan result, waiters)
	for i := range results {
		results[i] = b.execute("k-1", time.Hour)
	}
	require.Eventually(t, func() bool { return watching.n.Load() >= waiters }, 5*time.Minute, 10*time.Millisecond, "every waiter found the key in progress and watches it")
	waiting := counter.Position()

	// One more is answered at once, not kept (the deadline turns a wait
	// into a failure).
	var over result
	select {
	case over = <-b.execute("k-1", time.Hour):
	case <-time.After(time.Minute):
		t.Fatal("a request beyond MaxWaiters waits")
	}
	require.ErrorIs(t, over.err, idem.ErrInProgress)
	require.Zero(t, over.out.Waited, "beyond MaxWaiters a request does not wait")

	// The window runs from a check of the store's loop to the third after
	// it: every waiter is watching by then.
	isCheck := func(sql string) bool { return strings.Contains(sql, "unnest(") }
	checksSince := func(from wirecount.Position) int {
		n := 0
		for _, sql := range counter.Between(from, counter.Position()).Statements {
			if isCheck(sql) {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return checksSince(waiting) >= 1 }, time.Minute, 5*time.Millisecond)
	from := counter.Position()
	const ticks = 3
	require.Eventually(t, func() bool { return checksSince(from) >= ticks }, time.Minute, 5*time.Millisecond)
	to := counter.Position()
	window := counter.Between(from, to).Statements
	checks := checksSince(from) // the window's own, and any since
	require.Equal(t, ticks, len(window), "%d waiters cost one statement per tick: %q", waiters, window)
	t.Logf("%d waiters on one key: %d statements to find it in progress and start watching, then %d statements over %d ticks of the wait loop (%d checks since)",
		waiters, counter.Between(began, waiting).RoundTrips, len(window), ticks, checks)

	during := otherTenant("during")
	t.Logf("another tenant's request (median of 5): %s without waiters, %s with %d waiting (%.2fx)", alone, during, waiters, float64(during)/float64(alone))

	// When the attempt ends, the waiters of this process share one
	// acquisition of the key and its stored response, rather than 2,000
	// acquisitions queued at once for the pool's few connections (which
	// outlast the store's timeout on a loaded machine).
	released := counter.Position()
	b.pause.Release()
	require.NoError(t, (<-first).err)
	for _, done := range results {
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, idem.OutcomeReplayed, r.out.Kind)
		require.Equal(t, 201, r.out.Response.Status)
	}
	afterRelease := counter.Between(released, counter.Position()).Statements
	t.Logf("the attempt ended: its last phases and %d waiters' answers took %d statements", waiters, len(afterRelease))
	require.Less(t, len(afterRelease), 50, "%d waiters share the acquisition that finds the key finished: %q", waiters, afterRelease)
	require.Equal(t, 1+3*5, b.provider.Charges(), "k-1 and the other tenant's keys, each charged once")
}
