package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

// citusStore is a store on a schema of the shared Citus cluster, migrated
// with the Citus layout (skipped loudly without Citus).
func citusStore(t *testing.T) (*Store, *pgtest.Schema) {
	t.Helper()
	schema := pgtest.NewCitusSchema(t)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name, Citus: true})
	require.NoError(t, err)
	_, err = m.Up(context.Background())
	require.NoError(t, err)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	require.True(t, store.Distributed())
	require.True(t, store.waitsNow().Polling, "on Citus, waits poll")
	return store, schema
}

func citusAcquire(t *testing.T, store *Store, scope, key string, now time.Time) *idemdriver.AcquireResult {
	t.Helper()
	res, err := store.Acquire(context.Background(), idemdriver.AcquireParams{Scope: scope, Key: key, Flow: "f", Method: "POST", Path: "/x",
		Fingerprints: [][]byte{append([]byte{2}, make([]byte, 32)...)}, Params: []byte(`{}`),
		Lease: 90 * time.Second, Now: &now})
	require.NoError(t, err)
	return res
}

// Every statement the store sends for one key is a single task on Citus:
// EXPLAIN shows Citus's adaptive executor sending one task, to one worker.
// The acquisition's delegation to the scope's worker shows as a single
// task too. The five that insert the lease row from a CTE run as several
// steps, each a single task.
func TestCitusKeyStatementsAreSingleTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := citusStore(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := citusAcquire(t, store, "user:7", "k", now).Record
	q := store.q
	holder := store.holder.args()
	statements := map[string][]any{
		"acquire":           {nil, "user:7", "k", "f", "POST", "/x", make([]byte, 33), "{}", int64(1), false, "", "", "", 0, "", int64(1)},
		"takeOver":          append(append([]any{nil, rec.ID, "f", rec.Fingerprint, int64(1), "POST", "/x"}, holder...), "user:7"),
		"claimReconcile":    append([]any{nil, "user:7", "k", int64(1)}, holder...),
		"advancePhase":      {rec.ID, rec.Fence, "p", `{}`, nil, "user:7"},
		"withdrawPhase":     {rec.ID, rec.Fence, "p", `{}`, nil, "user:7"},
		"finishPhase":       {rec.ID, rec.Fence, `{}`, 201, `{}`, []byte{}, int64(1), nil, "", "finished", "", "user:7"},
		"heartbeat":         {rec.ID, rec.Fence, int64(1), nil, "user:7"},
		"release":           {rec.ID, rec.Fence, "e", "user:7"},
		"setNeedsReconcile": {rec.ID, rec.Fence, "e", "user:7"},
		"markForeign":       {rec.ID, rec.Fence, "p", "user:7"},
		"clearForeignMark":  {rec.ID, rec.Fence, "user:7"},
		"getKey":            {"user:7", "k"},
		"unlockKey":         {"user:7", "k", "why"},
		"waitCheck":         {rec.ID, rec.Fence, "user:7"},
		"claimIdleOne":      {"user:7", rec.ID, rec.Fence, now, now},
		"reapAbandonedOne":  {"user:7", rec.ID, rec.Fence, now},
		"leaseRowOf":        {"user:7", rec.ID, rec.Fence},
		"lookUp":            {nil, "user:7", "k"},
	}
	sql := map[string]string{
		"acquire": q.acquire, "takeOver": q.takeOver, "claimReconcile": q.claimReconcile,
		"advancePhase": q.advancePhase, "withdrawPhase": q.withdrawPhase, "finishPhase": q.finishPhase, "heartbeat": q.heartbeat,
		"release": q.release, "setNeedsReconcile": q.setNeedsReconcile, "markForeign": q.markForeign,
		"clearForeignMark": q.clearForeignMark, "getKey": q.getKey, "unlockKey": q.unlockKey,
		"waitCheck": q.waitCheck, "claimIdleOne": q.claimIdleOne, "reapAbandonedOne": q.reapAbandonedOne,
		"leaseRowOf": q.leaseRowOf, "lookUp": q.lookUp,
	}
	// The statements that move a fence or unlock a key and insert or upsert
	// the lease row from a CTE (INSERT ... SELECT): Citus plans their CTEs
	// as subplans, each a single task on the scope's worker, in one
	// distributed transaction. They run for takeovers, reconcile claims,
	// forced unlocks and attempts that fail or park, never for a request
	// that finds its key free or held, nor for a phase that commits.
	multiStep := map[string]bool{"takeOver": true, "claimReconcile": true, "unlockKey": true,
		"release": true, "setNeedsReconcile": true}
	for name, args := range statements {
		rows, err := schema.Pool.Query(ctx, "EXPLAIN "+sql[name], args...)
		require.NoError(t, err, name)
		var plan []string
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err(), name)
		text := strings.Join(plan, "\n")
		steps := strings.Count(text, "Task Count:")
		require.Equal(t, steps, strings.Count(text, "Task Count: 1\n"), "%s sends a step to more than one shard:\n%s", name, text)
		if multiStep[name] {
			require.Greater(t, steps, 0, name)
			t.Logf("%s: %d steps, each a single task on the scope's worker", name, steps)
			continue
		}
		require.Equal(t, 1, steps, "%s runs more than one distributed step (a subplan):\n%s", name, text)
		t.Logf("%s: a single task", name)
	}
}

// The completer's claim on Citus: two stores claiming the same idle keys at
// once get disjoint sets whose union is every key; and the reaper's: two
// reapers racing over the same expired keys delete each once.
func TestCitusRacingClaimersAndReapersShareNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := citusStore(t)
	other, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(other.Close)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const keys = 40
	for i := range keys {
		rec := citusAcquire(t, store, fmt.Sprintf("user:%d", i), "k", now).Record
		require.NoError(t, store.Release(ctx, idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence, Scope: rec.Scope}, "gave up"))
	}
	later := now.Add(time.Hour)
	claim := idemdriver.ClaimIdleParams{Status: idemtype.StoredRunning, Flows: []string{"f"}, IdleFor: time.Minute, Limit: keys, Now: &later}
	var wg sync.WaitGroup
	claimed := make([][]*idemtype.KeyRecord, 2)
	for i, s := range []*Store{store, other} {
		wg.Go(func() {
			recs, err := s.ClaimIdle(ctx, claim)
			if err != nil {
				t.Errorf("claim: %v", err)
			}
			claimed[i] = recs
		})
	}
	wg.Wait()
	seen := map[int64]bool{}
	for _, recs := range claimed {
		for _, rec := range recs {
			require.False(t, seen[rec.ID], "key %d claimed twice", rec.ID)
			seen[rec.ID] = true
		}
	}
	require.Len(t, seen, keys, "every idle key claimed once")
	t.Logf("two claimers over %d idle keys: %d and %d claimed, none twice", keys, len(claimed[0]), len(claimed[1]))

	// Finish every key, then let it expire; two reapers race.
	for i := range keys {
		rec := citusAcquire(t, store, fmt.Sprintf("user:%d", i), "k", later.Add(time.Hour)).Record
		if rec.Status != idemtype.StoredRunning {
			continue
		}
		tx, err := store.BeginPhase(ctx, idemdriver.PhaseOptions{})
		require.NoError(t, err)
		require.NoError(t, tx.CommitPhase(ctx, idemdriver.CommitParams{Ref: idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence, Scope: rec.Scope},
			Status: idemtype.StoredFinished, Response: &idemtype.Response{Status: 201}, Retention: time.Minute, Now: &later}))
	}
	gone := later.Add(2 * time.Hour)
	deleted := make([]int, 2)
	for i, s := range []*Store{store, other} {
		wg.Go(func() {
			for {
				n, err := s.Reap(ctx, idemdriver.ReapParams{Limit: 7, Now: &gone})
				if err != nil {
					t.Errorf("reap: %v", err)
					return
				}
				if n == 0 {
					return
				}
				deleted[i] += n
			}
		})
	}
	wg.Wait()
	require.Equal(t, keys, deleted[0]+deleted[1], "each expired key deleted once")
	var left int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys`).Scan(&left))
	require.Zero(t, left)
	t.Logf("two reapers over %d expired keys: %d and %d deleted", keys, deleted[0], deleted[1])
}

// Two stores claim the same needs_reconcile key for a reconcile run at
// once, eight times over: exactly one gets it each time, with a new fence.
func TestCitusRacingReconcileClaimsOneWins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := citusStore(t)
	other, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(other.Close)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range 8 {
		scope := fmt.Sprintf("user:%d", i)
		rec := citusAcquire(t, store, scope, "k", now).Record
		require.NoError(t, store.SetNeedsReconcile(ctx, idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence, Scope: scope}, "in doubt"))
		var wg sync.WaitGroup
		results := make([]*idemdriver.AcquireResult, 2)
		for j, s := range []*Store{store, other} {
			wg.Go(func() {
				res, err := s.ClaimReconcile(ctx, idemdriver.ClaimParams{Scope: scope, Key: "k", Lease: time.Minute, Now: &now})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				results[j] = res
			})
		}
		wg.Wait()
		won := 0
		for _, res := range results {
			if res != nil && res.Acquired == idemdriver.AcquiredTakenOver {
				won++
				require.Equal(t, rec.Fence+1, res.Record.Fence)
			}
		}
		require.Equal(t, 1, won, "claims of %s: exactly one wins", scope)
	}
}

// A batch's statement timeout (set_config('statement_timeout', ..., true)
// in its transaction on the coordinator) also ends the batch's work on the
// workers: a statement sleeping there is cancelled with it, not left to run.
func TestCitusBatchStatementTimeoutReachesTheWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := citusStore(t)
	citusAcquire(t, store, "user:1", "k", time.Now())
	err := store.inBatchTx(ctx, "sleep", 200*time.Millisecond, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT pg_sleep(600) FROM idem_keys`)
		return err
	})
	require.Error(t, err)
	require.True(t, statementTimedOut(err), "%v", err)
	// Had the worker's part not been cancelled, it would sleep for ten
	// minutes.
	sleeping := func() bool {
		var n int
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT coalesce(sum(result::int), 0) FROM run_command_on_workers(
			format('SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND wait_event = %L AND query LIKE %L',
			       'PgSleep', '%' || $1 || '.idem_keys%'))`, schema.Name).Scan(&n))
		return n > 0
	}
	require.Eventually(t, func() bool { return !sleeping() }, time.Minute, 50*time.Millisecond, "a worker still runs the timed-out statement")
}

// On Citus the waited keys are checked one by one: a key whose check fails
// (here a scope the server refuses, standing in for a key on a dead worker)
// is left to be checked again, and the others are still answered, so their
// waiters are woken.
func TestCitusOneFailingWaitCheckDoesNotHoldUpTheOthers(t *testing.T) {
	t.Parallel()
	store, _ := citusStore(t)
	ctx := context.Background()
	res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "user:1", Key: "k1", Flow: "f", Method: "POST", Path: "/",
		Fingerprints: [][]byte{[]byte{1}}, Params: []byte(`{}`), Lease: time.Minute})
	require.NoError(t, err)
	rec := res.Record
	require.NoError(t, store.Release(ctx, idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence, Scope: rec.Scope}, ""))

	good := idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence, Scope: rec.Scope}
	bad := idemdriver.LockRef{ID: rec.ID + 1, Fence: 1, Scope: "user:\xff"} // not UTF-8: the statement fails
	_, _, badErr := store.checkWaited(ctx, bad)
	require.Error(t, badErr, "the stand-in for a failing check must fail")

	got, err := store.checkAllWaitedCitus(ctx, []idemdriver.LockRef{bad, good})
	require.NoError(t, err)
	require.Equal(t, map[int64]waitState{good.ID: {over: true}}, got, "the released key's attempt is over; the failing one is left out")

	_, err = store.checkAllWaitedCitus(ctx, []idemdriver.LockRef{bad})
	require.Error(t, err, "with no key answered, the error")
}

// On Citus the completer's claim takes its candidates key by key: a
// candidate whose row another transaction holds locked (a phase commit, a
// heartbeat, another claimer) is passed over, as SKIP LOCKED passes over it
// on plain PostgreSQL, instead of blocking the whole batch behind it until
// the store's timeout ends the claim and loses the keys already claimed.
func TestCitusClaimPassesOverALockedCandidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := citusStore(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var ids []int64
	for i := range 3 {
		rec := citusAcquire(t, store, fmt.Sprintf("user:%d", i), "k", now.Add(time.Duration(i)*time.Second)).Record
		require.NoError(t, store.Release(ctx, idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence, Scope: rec.Scope}, "gave up"))
		ids = append(ids, rec.ID)
	}

	// The oldest candidate's row is locked by a transaction that stays open.
	holder, err := schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	_, err = holder.Exec(ctx, `SELECT 1 FROM idem_keys WHERE scope = 'user:0' AND id = $1 FOR UPDATE`, ids[0])
	require.NoError(t, err)

	later := now.Add(time.Hour)
	claimCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	recs, err := store.ClaimIdle(claimCtx, idemdriver.ClaimIdleParams{
		Status: idemtype.StoredRunning, Flows: []string{"f"}, IdleFor: time.Minute, Limit: 3, Now: &later})
	require.NoError(t, err)
	var claimed []int64
	for _, rec := range recs {
		claimed = append(claimed, rec.ID)
	}
	require.Equal(t, ids[1:], claimed, "the two unlocked candidates are claimed, the locked one passed over")
}

// On Citus the abandoned-key reaper makes a candidate's lease row before
// it locks the key's rows, so a takeover that locked the progress row and
// then waits for that lease row must not be waited for in turn: the
// reaper passes over a key whose progress row is locked, as the plain
// statement does, instead of a deadlock that fails one of them.
func TestCitusReaperPassesOverAKeyATakeoverHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := citusStore(t)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := citusAcquire(t, store, "user:9", "k", t0).Record
	later := t0.Add(time.Hour)

	// The takeover's first step: the progress row, locked.
	takeover, err := schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = takeover.Rollback(ctx) }()
	_, err = takeover.Exec(ctx, `SELECT 1 FROM `+store.q.table+` WHERE scope = $1 AND id = $2 FOR NO KEY UPDATE`, "user:9", rec.ID)
	require.NoError(t, err)

	// The reaper's: the lease row made, then the key's rows locked.
	reaper, err := schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = reaper.Rollback(ctx) }()
	_, err = reaper.Exec(ctx, store.q.leaseRowOf, "user:9", rec.ID, rec.Fence)
	require.NoError(t, err)
	type reaped struct {
		deleted, parked int
		err             error
	}
	done := make(chan reaped, 1)
	go func() {
		var r reaped
		r.err = reaper.QueryRow(ctx, store.q.reapAbandonedOne, "user:9", rec.ID, rec.Fence, later).Scan(&r.deleted, &r.parked)
		if r.err == nil {
			r.err = reaper.Commit(ctx)
		}
		done <- r
	}()

	// The takeover's insert of the lease row waits for the reaper's.
	taken, err := store.acquisition(ctx, takeover, store.q.takeOver, append(append([]any{&later, rec.ID, "f", rec.Fingerprint,
		(90 * time.Second).Microseconds(), "POST", "/x"}, store.holder.args()...), "user:9")...)
	require.NoError(t, err, "the takeover")
	require.NoError(t, takeover.Commit(ctx))
	require.Equal(t, idemdriver.AcquiredTakenOver, taken.Acquired)
	r := <-done
	require.NoError(t, r.err, "the reaper")
	require.Equal(t, 0, r.deleted+r.parked, "the reaper left the key a takeover held alone")
}
