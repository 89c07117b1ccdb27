package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
)

// waitBench is a ride flow whose first charge blocks until released (and
// then fails, when told to), and a runner on the database's clock that
// counts the in-progress answers.
type waitBench struct {
	*testBundle
	runner     *idem.Runner
	entered    chan struct{}
	release    chan struct{}
	open       func()
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
	b := &waitBench{testBundle: tb, entered: make(chan struct{}), release: make(chan struct{}), inProgress: make(chan struct{}, 16)}
	b.open = sync.OnceFunc(func() { close(b.release) })
	// A test that fails before it opens the gate must not leave the phase
	// blocked on a connection the schema's cleanup waits for.
	t.Cleanup(b.open)
	var once sync.Once
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(b.entered)
		<-b.release
		if b.fail.Load() {
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

// storeOnly hides the store's KeyWatcher: the runner then polls.
type storeOnly struct{ idemdriver.Store }

// A request with Wait that finds its key in flight waits for it and gets
// its stored response, with a store that wakes it and with one the runner
// polls.
func TestWaitGetsTheStoredResponse(t *testing.T) {
	t.Parallel()
	for _, watched := range []bool{true, false} {
		t.Run(map[bool]string{true: "watched", false: "polled"}[watched], func(t *testing.T) {
			t.Parallel()
			var wrap func(idemdriver.Store) idemdriver.Store
			if !watched {
				wrap = func(s idemdriver.Store) idemdriver.Store { return storeOnly{s} }
			}
			b := setupWait(t, wrap)
			first := b.execute("k-1", 0)
			<-b.entered
			waiter := b.execute("k-1", time.Minute)
			<-b.inProgress
			b.open()
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
	<-b.entered
	began := time.Now()
	r := <-b.execute("k-1", 2*time.Second)
	require.GreaterOrEqual(t, time.Since(began), 2*time.Second)
	require.ErrorIs(t, r.err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, r.out.Kind)
	require.Positive(t, r.out.Waited)
	require.Positive(t, r.out.RetryAfter)
	b.open()
	require.NoError(t, (<-first).err)
}

// An attempt that fails while a request waits releases the key: the waiter
// gets what a retry arriving then gets, the key taken over and resumed.
func TestWaitAfterAFailure(t *testing.T) {
	t.Parallel()
	b := setupWait(t, nil)
	b.fail.Store(true)
	first := b.execute("k-1", 0)
	<-b.entered
	waiter := b.execute("k-1", time.Minute)
	<-b.inProgress
	b.open()
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
	<-b.entered
	waiter := b.execute("k-1", time.Minute)
	<-b.inProgress
	b.open()
	one, two := <-first, <-waiter
	require.NoError(t, one.err)
	require.NoError(t, two.err)
	require.Equal(t, idem.OutcomeReplayed, two.out.Kind)
	require.Equal(t, one.out.Response.Body, two.out.Response.Body)
	require.Positive(t, two.out.Waited)
	require.Eventually(t, b.store.Polling, time.Minute, 5*time.Millisecond, "the listener found the pooler: the store polls")
	require.False(t, b.store.Listening())
	require.Zero(t, b.store.Notifications(), "no LISTEN through a transaction pooler")
	require.Equal(t, 1, b.provider.Charges())
}

// deafWatcher is a store whose KeyWatcher never wakes anyone: a wake-up
// lost.
type deafWatcher struct{ idemdriver.Store }

func (deafWatcher) WatchKey(context.Context, idemdriver.LockRef) (<-chan struct{}, func()) {
	return make(chan struct{}), func() {}
}

// A waiter whose wake-up never comes acquires the key once more when its
// wait passes, and gets the stored response rather than a 409.
func TestWaitAcquiresOnceMoreAtItsEnd(t *testing.T) {
	t.Parallel()
	b := setupWait(t, func(s idemdriver.Store) idemdriver.Store { return deafWatcher{s} })
	first := b.execute("k-1", 0)
	<-b.entered
	waiter := b.execute("k-1", 2*time.Second)
	<-b.inProgress
	b.open()
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
			entered, release := make(chan struct{}), make(chan struct{})
			b.hooks["receipt_enqueued"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
				// The phase's snapshot is taken by its first statement.
				if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
					return err
				}
				close(entered)
				<-release
				return nil
			}
			open := sync.OnceFunc(func() { close(release) })
			t.Cleanup(open)
			first := b.execute("k-1", 0)
			<-entered
			waiter := b.execute("k-1", time.Minute)
			<-b.inProgress
			require.Eventually(t, func() bool {
				var marked bool
				err := b.pool.QueryRow(context.Background(), `SELECT waited_at IS NOT NULL FROM idem_leases`).Scan(&marked)
				return err == nil && marked && b.store.Listening()
			}, 10*time.Second, 5*time.Millisecond, "the waiter marks the key while the last phase runs, and its store listens")
			open()
			one, two := <-first, <-waiter
			require.NoError(t, one.err)
			require.NoError(t, two.err)
			require.Equal(t, idem.OutcomeReplayed, two.out.Kind)
			require.Positive(t, b.store.Notifications(), "woken by a notification, not by the 5 s recheck")
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
	<-b.entered
	ctx, cancel := context.WithCancel(context.Background())
	waiter := b.executeWaiting("k-1", time.Hour, ctx)
	<-b.inProgress
	cancel()
	r := <-waiter
	// It ended while the first attempt is still held (opened only below),
	// not after the hour it asked for.
	require.ErrorIs(t, r.err, idem.ErrInProgress)
	b.open()
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
	_, err = b.pool.Exec(ctx, `UPDATE idem_leases SET waited_at = now() WHERE scope = $1 AND key_id = $2`, "user:1", id2)
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
