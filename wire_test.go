package idem_test

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

// proxiedStore is a store whose every connection (the phases' pool and the
// control pool) goes through a fault proxy in front of the test's database.
type proxiedStore struct {
	proxy *idemtest.FaultProxy
	pool  *pgxpool.Pool
	store *pgstore.Store
}

func newProxiedStore(t *testing.T, b *testBundle) *proxiedStore {
	t.Helper()
	ctx := context.Background()
	proxy, err := idemtest.StartFaultProxy(ctx, b.schema.URL)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, proxy.Close()) })
	url, err := proxy.URL(b.schema.URL)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgstore.New(pool, &pgstore.Config{Schema: b.schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	return &proxiedStore{proxy: proxy, pool: pool, store: store}
}

// The COMMIT of a not-idempotent phase succeeds on the server but its reply
// is lost on the wire. The runner must find out from the key what happened:
// on main it sent the committed key to needs_reconcile with no mark, where no
// command could get it out, and the client never got an answer.
func TestLostCommitReplyOfNotIdempotentPhase(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ps := newProxiedStore(t, b.testBundle)
	var lost *idemtest.Fault
	r, err := idem.NewRunner(ps.store, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Test: idemtest.WithHook(idem.TestConfig{Now: b.clock.Now}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookBeforeCommit && at.Phase == "sms_sent" && lost == nil {
			lost = ps.proxy.LoseReply(idemtest.Rule{Tag: "COMMIT"})
		}
		return nil
	})})
	require.NoError(t, err)

	out, err := r.Execute(context.Background(), b.flow, b.req("k1"))
	require.NotNil(t, lost)
	require.Equal(t, 1, lost.Fired(), "the COMMIT reply of sms_sent was lost")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "k1")), "sent exactly once")
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Empty(t, rec.ForeignMark)
}

// A database that stops answering (a partition, a hung server) instead of
// refusing connections: every request is answered within the statement
// bound as store unavailable, nothing piles up, and once the database
// answers again the same keys resume and finish, each effect once. On main
// no store operation had a deadline and every request hung.
//
// Not parallel: it counts the process's goroutines, which other tests would
// move.
func TestStalledDatabaseFailsClosedWithinTheBound(t *testing.T) {
	b := setup(t)
	before := runtime.NumGoroutine()
	ps := newProxiedStore(t, b)
	// Generous: the same runner does the warm-up and the recovery, and a
	// loaded machine under the race detector is slow.
	const timeout = 2 * time.Second
	r := func() *idem.Runner {
		r, err := idem.NewRunner(ps.store, &idem.Config{Flows: []idem.AnyFlow{b.flow}, StatementTimeout: timeout,
			Test: idem.TestConfig{Now: b.clock.Now}})
		require.NoError(t, err)
		return r
	}()
	ctx := context.Background()
	_, err := r.Execute(ctx, b.flow, b.request("warm-up", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	baseline := runtime.NumGoroutine()

	ps.proxy.Stall()
	const n = 60
	errs := make([]error, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			started := time.Now()
			_, errs[i] = r.Execute(ctx, b.flow, b.request("k"+strconv.Itoa(i), rideInput{Origin: "SF", Amount: 20}))
			took[i] = time.Since(started)
		})
	}
	wg.Wait()
	for i := range n {
		require.ErrorIs(t, errs[i], idem.ErrStoreUnavailable, "request %d", i)
		// A correctness bound, not a performance target: a handful of
		// bounded round trips (acquire, and at worst a release), never the
		// TCP timeout.
		require.Less(t, took[i], 20*timeout, "request %d answered after %s", i, took[i])
	}
	// Nothing piles up per request: what still waits on the silent
	// database is the pools' own connection attempts, bounded by their
	// sizes (and the proxy's side of them), far fewer than the requests.
	// The requests' own goroutines may still be returning: wait (bounded)
	// for them before counting.
	for deadline := time.Now().Add(time.Minute); runtime.NumGoroutine()-baseline >= n/2 && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	require.Less(t, runtime.NumGoroutine()-baseline, n/2, "goroutines stay bounded while the database is silent")

	ps.proxy.Resume()
	// Keys whose insert landed before the stall are held by a lease that
	// never got released; once it runs out, the retries take them over.
	b.clock.Advance(idem.LeaseDefault + time.Second)
	for i := range n {
		out, err := r.Execute(ctx, b.flow, b.request("k"+strconv.Itoa(i), rideInput{Origin: "SF", Amount: 20}))
		require.NoError(t, err, "request %d", i)
		require.Equal(t, http.StatusCreated, out.Response.Status)
	}
	require.Equal(t, n+1, b.countRows(t, "rides"))
	require.Equal(t, n+1, b.provider.Charges())
	// Once it answers, the stalled connection attempts finish or fail:
	// closing the pools and the proxy leaves nothing behind.
	ps.store.Close()
	ps.pool.Close()
	require.NoError(t, ps.proxy.Close())
	for deadline := time.Now().Add(time.Minute); runtime.NumGoroutine() > before+2 && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), before+2, "goroutines back to their baseline")
}
