package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// countingObserver counts events by kind and sums their Count.
type countingObserver struct {
	mu     sync.Mutex
	events map[idem.EventKind]int
	counts map[idem.EventKind]int
	// onEvent, if set, runs after counting, on the emitting goroutine.
	onEvent func(idem.Event)
}

func newCountingObserver() *countingObserver {
	return &countingObserver{events: map[idem.EventKind]int{}, counts: map[idem.EventKind]int{}}
}

func (o *countingObserver) Observe(_ context.Context, e idem.Event) {
	o.mu.Lock()
	o.events[e.Kind]++
	o.counts[e.Kind] += e.Count
	o.mu.Unlock()
	if o.onEvent != nil {
		o.onEvent(e)
	}
}

func (o *countingObserver) n(kind idem.EventKind) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.events[kind]
}

func (o *countingObserver) sum(kind idem.EventKind) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[kind]
}

// insertKeys generates n keys named prefix-1..prefix-n in one state, relative
// to now, server-side: one INSERT ... SELECT generate_series, which is how
// the tests get large tables cheaply. Keys 1-999 are in scope user:1, the
// next thousand in user:2, and so on, and expiries grow with the key
// number, so every index is filled nearly in order: a million rows take
// seconds, not minutes.
func (b *testBundle) insertKeys(t *testing.T, prefix string, n int, state idemtype.KeyState, now time.Time) {
	t.Helper()
	status, point, locked, lease := "running", "started", "NULL", "NULL"
	var expires string
	switch state {
	case idemtype.KeyStateExpired:
		// Expiries a millisecond apart up to exactly now: expiry is
		// inclusive.
		status, point, expires = "finished", "finished", "$1 - ($3::int - g) * interval '1 millisecond'"
	case idemtype.KeyStateFinished:
		// Expiring a microsecond apart from a microsecond after now.
		status, point, expires = "finished", "finished", "$1 + g * interval '1 microsecond'"
	case idemtype.KeyStateStale:
		// The runner never writes an expiry on an unfinished key; this one
		// is here to prove the reaper looks at the status, not the expiry.
		expires = "$1 - interval '1 hour'"
	case idemtype.KeyStateRunning:
		expires, locked, lease = "NULL", "$1", "$1 + interval '1 hour'"
	case idemtype.KeyStateNeedsReconcile:
		status, expires = "needs_reconcile", "$1 - interval '1 hour'"
	default:
		t.Fatalf("insertKeys: state %q", state)
	}
	// Unfinished keys get their lease row, as the runner makes them.
	sql := fmt.Sprintf(`
WITH k AS (
INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, status, recovery_point,
                       response_status, response_headers, response_body,
                       created_at, last_run_at, finished_at, expires_at, reap_after)
SELECT 'user:' || (1 + g / 1000), $2 || '-' || g, 'rides.create', 'POST', '/rides', $6, $7,
       $4, $5,
       CASE WHEN $4 = 'finished' THEN 201 END, CASE WHEN $4 = 'finished' THEN '{}'::jsonb END,
       CASE WHEN $4 = 'finished' THEN '{"ride_id":1}'::bytea END,
       $1 - interval '25 hours', $1 - interval '25 hours',
       CASE WHEN $4 = 'finished' THEN $1 - interval '25 hours' END, %[2]s,
       -- As the store writes it: no later than the expiry; an unfinished
       -- key's is its creation plus a retention longer than any test's.
       CASE WHEN $4 = 'finished' THEN %[2]s ELSE $1 - interval '25 hours' + interval '30 days' END
FROM generate_series(1, $3::int) g
RETURNING scope, id, fence, status
)
INSERT INTO idem_leases (scope, key_id, fence, locked_at, lease_expires_at)
SELECT scope, id, fence, %[1]s, %[3]s FROM k WHERE status <> 'finished'`, locked, expires, lease)
	// Every $1 is the clock; say so once for the type inference.
	sql = strings.ReplaceAll(sql, "$1", "$1::timestamptz")
	sql = strings.ReplaceAll(sql, "$4", "$4::text") // status is a domain, compared as text too
	// The params of a real rides.create request, so the completer can run
	// the unfinished ones (it resumes a key by the fingerprint it has).
	params, err := json.Marshal(rideInput{Origin: "SF"})
	require.NoError(t, err)
	fingerprint := append([]byte{2}, make([]byte, 32)...)
	_, err = b.pool.Exec(context.Background(), sql, now, prefix, n, status, point, fingerprint, params)
	require.NoError(t, err)
}

// countKeys counts keys whose name starts with prefix-.
func (b *testBundle) countKeys(t *testing.T, prefix string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idem_keys WHERE key LIKE $1 || '-%'`, prefix).Scan(&n))
	return n
}

// The million-row case: the reaper removes exactly the expired finished
// keys, leaves every unfinished key and every business row, and
// acquisitions of new keys keep completing while it works through the
// backlog.
func TestReapMillionRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()

	const (
		expired   = 500_000
		live      = 400_000
		stale     = 50_000
		reconcile = 50_000
	)
	began := time.Now()
	b.insertKeys(t, "expired", expired, idemtype.KeyStateExpired, now)
	b.insertKeys(t, "live", live, idemtype.KeyStateFinished, now)
	b.insertKeys(t, "stale", stale, idemtype.KeyStateStale, now)
	b.insertKeys(t, "reconcile", reconcile, idemtype.KeyStateNeedsReconcile, now)
	// Business rows referencing a spread of keys of every kind, through an
	// indexed ON DELETE SET NULL foreign key, as docs/operations.md asks.
	_, err := b.pool.Exec(ctx, `
		CREATE INDEX rides_key_id ON rides (key_id);
		INSERT INTO rides (key_id, origin) SELECT id, key FROM idem_keys WHERE id % 500 = 0;
		ANALYZE idem_keys; ANALYZE rides`)
	require.NoError(t, err)
	var rides, ridesOfExpired int
	require.NoError(t, b.pool.QueryRow(ctx,
		`SELECT count(*), count(*) FILTER (WHERE origin LIKE 'expired-%') FROM rides`).Scan(&rides, &ridesOfExpired))
	require.Positive(t, ridesOfExpired)
	t.Logf("generated %d keys and %d rides in %s", expired+live+stale+reconcile, rides, time.Since(began))

	// The reaper, in a process of its own. Its second batch waits until
	// acquisitions that started after its first have completed, so they
	// demonstrably overlap; after that both run freely.
	firstBatch, acquiredSome, reapDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	reapObs := newCountingObserver()
	var batches atomic.Int64
	reapObs.onEvent = func(e idem.Event) {
		if e.Kind != idem.EventReaped {
			return
		}
		switch batches.Add(1) {
		case 1:
			close(firstBatch)
		case 2:
			<-acquiredSome
		}
	}
	reaper := b.runner(t, &idem.Config{Observer: reapObs})

	var (
		reapRes *idem.ReapResult
		reapErr error
	)
	reapStarted := time.Now()
	go func() {
		defer close(reapDone)
		// A minute per batch: the point is what gets deleted, and a loaded
		// machine can take more than the default for 5000 rows.
		reapRes, reapErr = reaper.Reap(ctx, &idem.ReapConfig{BatchSize: 5000, StatementTimeout: time.Minute})
	}()

	// Client traffic on new keys, from another process, while the reaper
	// runs.
	app := b.runner(t, &idem.Config{StatementTimeout: time.Minute})
	<-firstBatch
	acquired := 0
	for i := 0; ; i++ {
		out, err := app.Execute(ctx, b.flow, b.request(fmt.Sprintf("new-%d", i), rideInput{Origin: "NYC", Amount: 10}))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out.Kind)
		acquired++
		if acquired == 5 {
			close(acquiredSome)
		}
		select {
		case <-reapDone:
		default:
			continue
		}
		break
	}
	require.NoError(t, reapErr)
	t.Logf("reaped %d keys in %d batches in %s, with %d requests served meanwhile",
		reapRes.Deleted, reapRes.Batches, time.Since(reapStarted), acquired)

	require.Equal(t, expired, reapRes.Deleted)
	require.Equal(t, expired, reapObs.sum(idem.EventReaped), "EventReaped counts add up to the deletions")
	require.Zero(t, reapObs.n(idem.EventStoreError))
	require.Zero(t, b.countKeys(t, "expired"))
	require.Equal(t, live, b.countKeys(t, "live"))
	require.Equal(t, stale, b.countKeys(t, "stale"))
	require.Equal(t, reconcile, b.countKeys(t, "reconcile"))
	require.Equal(t, acquired, b.countKeys(t, "new"))

	var ridesAfter, orphaned, orphanedOfExpired int
	require.NoError(t, b.pool.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE key_id IS NULL),
		       count(*) FILTER (WHERE key_id IS NULL AND origin LIKE 'expired-%') FROM rides`).
		Scan(&ridesAfter, &orphaned, &orphanedOfExpired))
	require.Equal(t, rides+acquired, ridesAfter, "business rows survive the reaper")
	require.Equal(t, ridesOfExpired, orphaned, "only rides of reaped keys lost their key")
	require.Equal(t, ridesOfExpired, orphanedOfExpired)

	// A second pass finds nothing.
	again, err := reaper.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, &idem.ReapResult{Deleted: 0, Batches: 1}, again)
}

// Batches are bounded by BatchSize, a pass by MaxBatches, and only finished
// keys past their expiry go, whatever else is in the table.
func TestReapBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	b.insertKeys(t, "expired", 25, idemtype.KeyStateExpired, now)
	b.insertKeys(t, "live", 5, idemtype.KeyStateFinished, now)
	b.insertKeys(t, "stale", 3, idemtype.KeyStateStale, now)
	b.insertKeys(t, "running", 3, idemtype.KeyStateRunning, now)
	b.insertKeys(t, "reconcile", 3, idemtype.KeyStateNeedsReconcile, now)
	var sizes []int
	obs := newCountingObserver()
	obs.onEvent = func(e idem.Event) {
		if e.Kind == idem.EventReaped {
			sizes = append(sizes, e.Count)
		}
	}
	r := b.runner(t, &idem.Config{Observer: obs})

	res, err := r.Reap(ctx, &idem.ReapConfig{BatchSize: 10, MaxBatches: 1})
	require.NoError(t, err)
	require.Equal(t, &idem.ReapResult{Deleted: 10, Batches: 1}, res)
	require.Equal(t, 15, b.countKeys(t, "expired"))

	res, err = r.Reap(ctx, &idem.ReapConfig{BatchSize: 10})
	require.NoError(t, err)
	require.Equal(t, &idem.ReapResult{Deleted: 15, Batches: 2}, res)
	require.Equal(t, []int{10, 10, 5}, sizes)
	require.Zero(t, b.countKeys(t, "expired"))
	require.Equal(t, 14, b.countRows(t, "idem_keys"))

	// Expiry follows the clock: an hour on, the live keys have expired too.
	b.clock.Advance(time.Hour)
	res, err = r.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 5, res.Deleted)
	require.Equal(t, 9, b.countRows(t, "idem_keys WHERE status <> 'finished'"))
	require.Equal(t, 9, b.countRows(t, "idem_keys"))

	for name, cfg := range map[string]*idem.ReapConfig{
		"zero batch":       {BatchSize: -1},
		"huge batch":       {BatchSize: 1_000_000},
		"negative batches": {MaxBatches: -1},
		"tiny timeout":     {StatementTimeout: time.Microsecond},
		"negative pause":   {Pause: -time.Second},
	} {
		_, err := r.Reap(ctx, cfg)
		require.ErrorContains(t, err, "invalid reap config", name)
	}
	require.Equal(t, &idem.ReapConfig{BatchSize: 1000, StatementTimeout: 10 * time.Second}, (&idem.ReapConfig{}).WithDefaults())
}

// Reapers in several processes at once delete disjoint batches: the
// deletions add up to the expired keys exactly.
func TestConcurrentReapersShareTheWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertKeys(t, "expired", 2000, idemtype.KeyStateExpired, b.clock.Now())
	const reapers = 4
	results := make(chan *idem.ReapResult, reapers)
	obs := newCountingObserver()
	for range reapers {
		r := b.runner(t, &idem.Config{Observer: obs})
		go func() {
			res, err := r.Reap(context.Background(), &idem.ReapConfig{BatchSize: 13})
			if err != nil {
				results <- nil
				return
			}
			results <- res
		}()
	}
	total := 0
	for range reapers {
		res := <-results
		require.NotNil(t, res, "a reaper failed")
		total += res.Deleted
	}
	// A reaper stops at a short batch, which rows locked by the others can
	// cause; a last pass picks up anything they left.
	res, err := b.runner(t, nil).Reap(context.Background(), nil)
	require.NoError(t, err)
	total += res.Deleted
	require.Equal(t, 2000, total)
	require.Equal(t, total-res.Deleted, obs.sum(idem.EventReaped))
	require.Zero(t, b.countKeys(t, "expired"))
}

// A batch that cannot finish within its statement timeout (here: a business
// row it must detach is locked by a long transaction) gives up with an error
// and a store-error event instead of queueing; nothing of it is deleted, and
// the next pass, once the lock is gone, succeeds.
func TestReapBatchGivesUpAtItsStatementTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertKeys(t, "expired", 5, idemtype.KeyStateExpired, b.clock.Now())
	_, err := b.pool.Exec(ctx, `INSERT INTO rides (key_id, origin) SELECT id, 'SF' FROM idem_keys`)
	require.NoError(t, err)

	blocker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `SELECT * FROM rides FOR UPDATE`)
	require.NoError(t, err)

	obs := newCountingObserver()
	r := b.runner(t, &idem.Config{Observer: obs})
	res, err := r.Reap(ctx, &idem.ReapConfig{StatementTimeout: 50 * time.Millisecond})
	require.ErrorContains(t, err, "statement timeout")
	require.Equal(t, &idem.ReapResult{}, res)
	require.Equal(t, 1, obs.n(idem.EventStoreError))
	require.Equal(t, 5, b.countKeys(t, "expired"))

	require.NoError(t, blocker.Rollback(ctx))
	// The default timeout: the point is that the batch goes through once
	// the lock is gone, not that it does so within 50ms on a loaded machine.
	res, err = r.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 5, res.Deleted)
	require.Equal(t, 5, b.countRows(t, "rides WHERE key_id IS NULL"))
}

// A running key whose not-idempotent call is in doubt (its foreign mark
// stands) is never deleted as abandoned: the client's next request would run
// as a new request and repeat the call. The reaper moves it to
// needs_reconcile instead.
func TestReaperParksAbandonedKeyWithCallInDoubt(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	crashing := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookAfterForeign, "sms_sent"))})
	_, err := crashing.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	ref := b.ref(t, "k1")
	require.Equal(t, 1, b.gateway.times(ref))
	require.Equal(t, "sms_sent", b.key(t, "k1").ForeignMark)

	// The process died; nobody retried for a while (a NoRedrive flow, or the
	// completer had given up at MaxAttempts, or simply an UnfinishedRetention shorter
	// than the completer's cadence).
	b.clock.Advance(2 * time.Hour)
	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, UnfinishedRetention: time.Hour})
	res, err := r.Reap(ctx, nil)
	require.NoError(t, err)
	t.Logf("reaper: abandoned %d, moved to needs_reconcile %d", res.Unfinished, res.NeedsReconcile)
	require.Zero(t, res.Unfinished)
	require.Equal(t, 1, res.NeedsReconcile)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Equal(t, "sms_sent", rec.ForeignMark, "the mark still names the phase in doubt")

	// The client comes back.
	out, err := r.Execute(ctx, b.flow, b.req("k1"))
	t.Logf("retry: outcome=%s err=%v", out.Kind, err)
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, 1, b.gateway.times(ref), "the not-idempotent SMS was sent twice")
}
