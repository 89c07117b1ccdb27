package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// A runner and a Maintainer carry on across a failover without a restart:
// the primary of a synchronous pair is killed with a request in flight and
// another abandoned, the standby is promoted, and the same runner, store and
// Maintainer, whose pools follow the multi-host URL, serve new requests at
// once. The keys locked at the kill stay locked for their lease and no
// longer: the interrupted request's retry takes its key over once the test
// clock has moved on by one lease, the Maintainer's completer finishes the
// abandoned one once it has been idle for IdleFor, and its reaper deletes
// every key once their retention is over. Each request is charged once.
func TestFailoverRunnerAndMaintainerCarryOn(t *testing.T) {
	t.Parallel()
	pair := pgtest.NewPair(t, &pgtest.PairOptions{Synchronous: true, Logf: t.Logf})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// A pool that pings every connection before handing it out: after the
	// failover none of the connections to the dead primary reaches a
	// statement, so each step below sees the new primary or a refusal to
	// connect, never a connection that breaks once (the rides test shows
	// clients riding through those with pgxpool's default).
	poolConfig, err := pgxpool.ParseConfig(pair.URL())
	require.NoError(t, err)
	poolConfig.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m, err := migrations.New(pool, nil)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
		CREATE TABLE rides (id bigserial PRIMARY KEY, key_id bigint REFERENCES idem_keys (id) ON DELETE SET NULL,
		                    origin text NOT NULL, charge_id text);
		CREATE TABLE jobs (id bigserial PRIMARY KEY, ride_id bigint NOT NULL, kind text NOT NULL)`)
	require.NoError(t, err)
	store, err := pgstore.New(pool, nil)
	require.NoError(t, err)
	t.Cleanup(store.Close)

	b := &testBundle{
		pool: pool, store: store,
		clock:    idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		provider: &testfixture.Provider{}, counts: &testfixture.PhaseCounts{},
		hooks: map[string]func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error{},
	}
	// The request in flight at the kill waits inside its charge phase, before
	// the call, until the primary is dead.
	pause := testfixture.NewPause(t)
	b.hooks["charge_created"] = func(ctx context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) error {
		if run.Key().Key == "in-flight" {
			pause.Hold(ctx)
		}
		return nil
	}
	b.flow = b.rideFlow("rides.create")

	// The one runner and the one Maintainer of this "process".
	var crashOnce sync.Once
	events := newEventLog()
	runner := b.runner(t, &idem.Config{
		Logger:   slog.New(slog.DiscardHandler),
		Observer: events,
		Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
			crash := false
			if at.Key.Key == "abandoned" && at.Phase == "charge_created" && at.Where == idemtest.HookPhaseStart {
				crashOnce.Do(func() { crash = true })
			}
			if crash {
				return idemtest.ErrSimulatedCrash
			}
			return nil
		}),
	})
	maintainerConfig := &idem.MaintainerConfig{
		ReapInterval: 20 * time.Millisecond, CompleteInterval: 20 * time.Millisecond, ReconcileInterval: -1,
	}
	maintainer, err := idem.NewMaintainer(runner, maintainerConfig)
	require.NoError(t, err)
	serveCtx, stopServing := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- maintainer.Serve(serveCtx) }()
	defer func() {
		stopServing()
		require.NoError(t, <-served)
	}()

	execute := func(ctx context.Context, key string) (*idem.Outcome, error) {
		return runner.Execute(ctx, b.flow, b.request(key, rideInput{Origin: key, Amount: 20}))
	}
	_, err = execute(ctx, "finished")
	require.NoError(t, err)
	_, err = execute(ctx, "abandoned")
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	inFlight := make(chan error, 1)
	go func() {
		_, err := execute(ctx, "in-flight")
		inFlight <- err
	}()
	select {
	case <-pause.Reached():
	case <-ctx.Done():
		t.Fatal("the request never entered its charge phase")
	}

	killed := time.Now()
	require.NoError(t, pair.KillPrimary())
	pause.Release()
	select {
	case err := <-inFlight:
		require.ErrorIs(t, err, idem.ErrStoreUnavailable, "the interrupted request fails closed")
	case <-ctx.Done():
		t.Fatal("the interrupted request never returned")
	}

	// A new request, retried from the kill on: the time to recover.
	recovered := make(chan time.Duration, 1)
	go func() {
		for ctx.Err() == nil {
			if _, err := execute(ctx, "after"); err == nil {
				recovered <- time.Since(killed)
				return
			} else if !errors.Is(err, idem.ErrStoreUnavailable) {
				t.Errorf("a request during the failover: %v", err)
				return
			}
			timer := time.NewTimer(10 * time.Millisecond)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
			}
		}
	}()
	require.NoError(t, pair.Promote(ctx))
	promoted := time.Since(killed)
	var recovery time.Duration
	select {
	case recovery = <-recovered:
	case <-ctx.Done():
		t.Fatal("no request succeeded on the new primary")
	}

	standby, err := pgx.ParseConfig(pair.StandbyURL())
	require.NoError(t, err)
	var port int
	require.NoError(t, pool.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port))
	require.Equal(t, int(standby.Port), port, "the runner's pool is on the promoted standby")

	// The interrupted and the abandoned requests' keys came over locked,
	// for one lease from the time they were last renewed.
	lease := runner.Config().Lease
	for _, key := range []string{"in-flight", "abandoned"} {
		rec := b.key(t, key)
		require.Equal(t, idemtype.StoredRunning, rec.Status, key)
		require.True(t, b.clock.Now().Add(lease).Equal(*rec.LeaseExpiresAt), "%s: lease until %s", key, rec.LeaseExpiresAt)
	}
	out, err := execute(ctx, "in-flight")
	require.ErrorIs(t, err, idem.ErrInProgress, "locked until its lease ends")
	require.Positive(t, out.RetryAfter)

	b.clock.Advance(lease)
	out, err = execute(ctx, "in-flight")
	require.NoError(t, err, "the lease is over: the retry takes the key over")
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, 201, out.Response.Status)

	// The Maintainer's completer finishes the abandoned request once it has
	// been idle long enough, on the new primary.
	b.clock.Advance(maintainer.Config().Complete.IdleFor)
	events.waitFor(ctx, t, "the completer finishes the abandoned request", func(l *eventLog) bool {
		return l.completed["abandoned"] > 0
	})
	require.Equal(t, idemtype.StoredFinished, b.key(t, "abandoned").Status)

	// And its reaper deletes every key once their retention is over.
	b.clock.Advance(runner.Config().Retention + time.Second)
	events.waitFor(ctx, t, "the reaper deletes the expired keys", func(l *eventLog) bool { return l.reaped >= 4 })
	require.Zero(t, b.countRows(t, "idem_keys"))

	require.Equal(t, 4, b.provider.Charges(), "one charge per request")
	require.Equal(t, 4, b.countRows(t, "rides WHERE charge_id IS NOT NULL"))
	require.Equal(t, 4, b.countRows(t, "jobs"))
	t.Logf("runner and Maintainer across a synchronous failover: Promote returned %s after the kill, the first new request was served %s after it; "+
		"the interrupted request resumed after one lease, the abandoned one completed, %d keys reaped",
		promoted.Round(time.Millisecond), recovery.Round(time.Millisecond), events.reapedTotal())
}

// eventLog records what the Maintainer did, for a test to wait on.
type eventLog struct {
	mu        sync.Mutex
	completed map[string]int
	reaped    int
	changed   chan struct{}
}

func newEventLog() *eventLog {
	return &eventLog{completed: map[string]int{}, changed: make(chan struct{}, 1)}
}

func (l *eventLog) Observe(_ context.Context, e idem.Event) {
	l.mu.Lock()
	switch e.Kind {
	case idem.EventCompleted:
		l.completed[e.Key]++
	case idem.EventReaped:
		l.reaped += e.Count
	default:
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

func (l *eventLog) reapedTotal() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reaped
}

// waitFor waits until done holds, checking after every event of note.
func (l *eventLog) waitFor(ctx context.Context, t *testing.T, what string, done func(*eventLog) bool) {
	t.Helper()
	for {
		l.mu.Lock()
		ok := done(l)
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-l.changed:
		case <-ctx.Done():
			t.Fatalf("waiting until %s: %v", what, ctx.Err())
		}
	}
}
