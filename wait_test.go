package idem_test

import (
	"context"
	"errors"
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
	r, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{b.flow},
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventInProgress {
				b.inProgress <- struct{}{}
			}
		})})
	require.NoError(t, err)
	b.runner = r
	return b
}

type result struct {
	out *idem.Outcome
	err error
}

func (b *waitBench) execute(key string, wait time.Duration) <-chan result {
	done := make(chan result, 1)
	go func() {
		req := b.request(key, rideInput{Origin: "here", Amount: 12})
		req.Wait = wait
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
	r := <-b.execute("k-1", 200*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(began), 200*time.Millisecond)
	require.ErrorIs(t, r.err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, r.out.Kind)
	require.Positive(t, r.out.Waited)
	require.LessOrEqual(t, r.out.Waited, 200*time.Millisecond)
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
	require.Zero(t, b.store.Notifications(), "no LISTEN through a transaction pooler")
	require.Equal(t, 1, b.provider.Charges())
}
