package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/hooks"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/migrations"
)

// The runner on Citus: idem's tables distributed by scope
// (migrations.Config.Citus), the business tables distributed by the same
// scope and co-located with them, on the test binary's shared cluster (a
// coordinator and two workers; pgtest.SharedCitus), each test in a schema
// of its own. Without Citus installed these tests are skipped with a loud
// note.

// setupCitus is setup on Citus: rides and jobs carry the key's scope, are
// distributed by it and co-located with idem_keys, and the flow's phases
// name it (testBundle.scoped), so each phase's writes and its guarded
// commit run on the worker that holds the scope.
func setupCitus(t *testing.T) *testBundle {
	t.Helper()
	return setupCitusOn(t, pgtest.NewCitusSchema(t))
}

// setupCitusOn is setupCitus in a schema the caller made on a Citus
// cluster: one of the test's own, for a test that kills a node.
func setupCitusOn(t *testing.T, schema *pgtest.Schema) *testBundle {
	t.Helper()
	ctx := context.Background()
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name, Citus: true})
	require.NoError(t, err)
	res, err := m.Up(ctx)
	require.NoError(t, err)
	require.True(t, res.Distributed)
	for _, sql := range []string{
		`CREATE TABLE rides (scope text NOT NULL, id bigserial, key_id bigint, origin text NOT NULL, charge_id text,
		                     PRIMARY KEY (scope, id))`,
		`CREATE TABLE jobs (scope text NOT NULL, id bigserial, ride_id bigint NOT NULL, kind text NOT NULL,
		                    PRIMARY KEY (scope, id))`,
		`SELECT create_distributed_table('rides', 'scope', colocate_with => 'idem_keys')`,
		`SELECT create_distributed_table('jobs', 'scope', colocate_with => 'idem_keys')`,
	} {
		_, err := schema.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	b := &testBundle{
		schema: schema, pool: schema.Pool, scoped: true,
		clock:    idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		provider: &testfixture.Provider{}, counts: &testfixture.PhaseCounts{},
		hooks: map[string]func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error{},
	}
	b.flow = b.rideFlow("rides.create")
	require.True(t, b.storeFor(t).Distributed(), "the store finds idem_keys distributed and runs its Citus statements")
	return b
}

// New key, replay byte for byte, a mismatch (422) and a request in
// progress (409), on Citus.
func TestCitusNewKeyReplayMismatchInProgress(t *testing.T) {
	t.Parallel()
	b := setupCitus(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	first, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, first.Kind)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, b.clock.Now().Add(24*time.Hour), rec.ExpiresAt.UTC())

	again, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, again.Kind)
	require.Equal(t, first.Response.Body, again.Response.Body)
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())

	mismatch, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "LA", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrMismatch)
	require.Equal(t, idem.OutcomeMismatch, mismatch.Kind)

	// Hold k2 inside its first phase: a second request is in progress.
	done, letGo := startPausedIn(t, b, "ride_created", nil, b.request("k2", rideInput{Origin: "SF", Amount: 5}))
	busy, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k2", rideInput{Origin: "SF", Amount: 5}))
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, busy.Kind)
	letGo()
	require.NoError(t, (<-done).err)
}

// A crash leaves the key locked until its lease expires; then a retry takes
// it over and resumes at the phase after the recovery point.
func TestCitusCrashResumesAfterTheLease(t *testing.T) {
	t.Parallel()
	crashLeavesKeyLockedUntilLeaseExpires(t, setupCitus(t))
}

// The heartbeat (a router UPDATE of the lease row, the clock in a CTE)
// keeps a slow phase's lease.
func TestCitusHeartbeatKeepsASlowPhaseLease(t *testing.T) {
	t.Parallel()
	heartbeatKeepsASlowPhaseLease(t, setupCitus(t))
}

// The fence on Citus: a worker whose key was taken over cannot commit; the
// guard, pushed down to the worker holding the scope, fails the pipelined
// COMMIT, and its business write there rolls back.
func TestCitusFencingStopsATakenOverWorker(t *testing.T) {
	t.Parallel()
	b := setupCitus(t)
	_, err := takeOverAPausedWorker(t, b, func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		_, err := tx.Exec(ctx, `INSERT INTO jobs (scope, ride_id, kind) VALUES ($1, 0, 'stale-worker-write')`, run.Key().Scope)
		return err
	})
	require.ErrorIs(t, err, idem.ErrLockLost)
	require.Equal(t, 0, b.countRows(t, "jobs WHERE kind = 'stale-worker-write'"), "the stale worker's write rolled back on its worker")
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, int64(2), b.key(t, "k1").Fence)
}

// A duplicate storm on Citus: 64 concurrent requests for one key execute
// once; then 200 scopes, spread over the workers, each sent twice at once
// and replayed, execute once each.
func TestCitusDuplicateStorm(t *testing.T) {
	t.Parallel()
	b := setupCitus(t)
	ctx := context.Background()
	r := b.runner(t, nil)

	const callers = 64
	kinds := map[idem.OutcomeKind]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-start
			out, err := r.Execute(ctx, b.flow, b.request("storm", rideInput{Origin: "SF", Amount: 20}))
			if err != nil && !errors.Is(err, idem.ErrInProgress) {
				t.Errorf("storm: %v", err)
				return
			}
			mu.Lock()
			kinds[out.Kind]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, 1, kinds[idem.OutcomeExecuted], "outcomes: %v", kinds)
	require.Equal(t, callers, kinds[idem.OutcomeExecuted]+kinds[idem.OutcomeReplayed]+kinds[idem.OutcomeInProgress])
	require.Equal(t, 1, b.provider.Charges())
	t.Logf("one key, %d concurrent requests: %v", callers, kinds)

	const scopes = 200
	request := func(i int) idem.Request {
		return idem.Request{Scope: fmt.Sprintf("user:%d", i), Key: "ride", Method: "POST", Path: "/rides", Params: rideInput{Origin: "Nice", Amount: 1}}
	}
	sem := make(chan struct{}, 16)
	for i := range scopes {
		for range 2 {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if _, err := r.Execute(ctx, b.flow, request(i)); err != nil && !errors.Is(err, idem.ErrInProgress) {
					t.Errorf("scope %d: %v", i, err)
				}
			})
		}
	}
	wg.Wait()
	for i := range scopes {
		out, err := r.Execute(ctx, b.flow, request(i))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, out.Response.Status)
	}
	require.Equal(t, scopes+1, b.countRows(t, "rides"), "one ride per key")
	require.Equal(t, scopes+1, b.provider.Charges(), "one charge per key: 0 double executions")
	// The keys' scopes first, then, on the coordinator alone, the nodes of
	// their shards: a statement joining idem_keys with Citus's catalog may
	// run the lookup on a worker, which knows no search_path of the test's.
	var scopeNames []string
	rows, err := b.pool.Query(ctx, `SELECT DISTINCT scope FROM idem_keys`)
	require.NoError(t, err)
	for rows.Next() {
		var scope string
		require.NoError(t, rows.Scan(&scope))
		scopeNames = append(scopeNames, scope)
	}
	require.NoError(t, rows.Err())
	var nodes int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(DISTINCT nodeport) FROM citus_shards
		WHERE shardid IN (SELECT get_shard_id_for_distribution_column($1, s) FROM unnest($2::text[]) s)`,
		b.schema.Name+".idem_keys", scopeNames).Scan(&nodes))
	require.Equal(t, 2, nodes, "the scopes' keys live on both workers")
	t.Logf("%d scopes over %d workers, each sent twice at once: %d rides, %d charges", scopes, nodes, b.countRows(t, "rides"), b.provider.Charges())
}

// The maintenance work on Citus, where its claims cannot lock rows on
// several shards at once: the completer finishes a request abandoned after
// its charge with one charge; the reaper deletes expired keys (the
// business rows, which carry no foreign key to idem_keys there, stay) and
// ends an abandoned key; an operator lists, counts and unlocks keys.
func TestCitusMaintenance(t *testing.T) {
	t.Parallel()
	b := setupCitus(t)
	ctx := context.Background()
	b.abandon(t, "k1")
	require.Equal(t, 1, b.provider.Charges())

	obs := newCountingObserver()
	completer := b.runner(t, &idem.Config{Observer: obs})
	b.clock.Advance(6 * time.Minute)
	res, err := completer.Complete(ctx, &idem.CompleteConfig{IdleFor: 5 * time.Minute})
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Completed: 1}, res)
	require.Equal(t, idemtype.StoredFinished, b.key(t, "k1").Status)
	require.Equal(t, 1, b.provider.Charges(), "exactly one charge")
	out, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)

	// A key abandoned before its charge, in another scope, and a stuck one
	// an operator unlocks.
	crashing := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookAfterCommit, "ride_created"))})
	req := b.request("k2", rideInput{Origin: "SF", Amount: 20})
	req.Scope = "user:2"
	_, err = crashing.Execute(ctx, b.flow, req)
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	list, err := b.runner(t, nil).ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, Limit: 10})
	require.NoError(t, err)
	require.Len(t, list.Keys, 2)
	backlog, err := b.runner(t, nil).Backlog(ctx)
	require.NoError(t, err)
	require.NotNil(t, backlog)
	unlocked, err := b.runner(t, nil).UnlockKey(ctx, "user:2", "k2", "operator")
	require.NoError(t, err)
	require.True(t, unlocked.Unlocked)

	// Past the retention, the reaper deletes the finished key; past a day,
	// it ends the abandoned one.
	b.clock.Advance(25 * time.Hour)
	daily := b.rideFlowConfig("rides.create", &idem.FlowConfig[rideInput]{UnfinishedRetention: 24 * time.Hour})
	reaped, err := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{daily}}).Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, reaped.Deleted)
	require.Equal(t, 1, reaped.Unfinished)
	_, err = b.storeFor(t).GetKey(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.Equal(t, 2, b.countRows(t, "rides"), "business rows outlive their keys")
	t.Logf("completer: %+v; reaper: %+v", res, reaped)
}

// Reconcile runs on Citus (the reconcile claim's several single-task steps,
// the per-key claims of idle needs_reconcile keys) resolve each key once.
// The flow's messages table is a reference table, a copy on every node, so
// each phase commits on every node with two-phase commit: the guard still
// decides, on the key's worker.
func TestCitusReconcileAllResolvesIdleKeys(t *testing.T) {
	t.Parallel()
	b := setupSMSOn(t, setupCitus(t))
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `SELECT create_reference_table('messages')`)
	require.NoError(t, err)
	r := b.runner(t, nil)
	keys := []string{"k1", "k2", "k3"}
	for _, key := range keys {
		b.gateway.lose = true // the send fails before reaching the gateway
		_, err := r.Execute(ctx, b.flow, b.req(key))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	}
	b.clock.Advance(2 * time.Minute)
	res, err := r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: time.Minute, BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 3, Resolved: 3}, res)
	for _, key := range keys {
		require.Equal(t, idemtype.StoredFinished, b.key(t, key).Status, key)
		require.Equal(t, 1, b.gateway.times(b.ref(t, key)), key)
	}
	t.Logf("reconcile: %+v", res)
}

// A request that waits for its key in flight (Request.Wait) on Citus is
// woken by the store's polling, the notify triggers being gone there, and
// gets the stored response.
func TestCitusWaitPolls(t *testing.T) {
	t.Parallel()
	b := setupWaitOn(t, setupCitus(t), nil)
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
	require.True(t, hooks.StoreWaits(b.store).Polling, "on Citus the store polls")
	require.Zero(t, hooks.StoreWaits(b.store).Notifications)
	require.Equal(t, 1, b.provider.Charges())
}

// A stale worker whose phase writes on another worker (a business row of
// another scope) and in a reference table (a copy on every node): the
// guard's failure at commit rolls all of it back, on every node, once the
// key was taken over.
func TestCitusFenceRollsBackAMultiNodePhase(t *testing.T) {
	t.Parallel()
	b := setupCitus(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE notes (id bigserial PRIMARY KEY, what text)`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `SELECT create_reference_table('notes')`)
	require.NoError(t, err)
	shardPort := func(scope string) int {
		var port int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('idem_keys', $1::text)`, scope).Scan(&port))
		return port
	}
	other := ""
	for i := 0; i < 200 && other == ""; i++ {
		if s := fmt.Sprint("user:other-", i); shardPort(s) != shardPort("user:1") {
			other = s
		}
	}
	require.NotEmpty(t, other, "a scope on the other worker")

	_, err = takeOverAPausedWorker(t, b, func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO jobs (scope, ride_id, kind) VALUES ($1, 0, 'stale-other-worker')`, other); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO notes (what) VALUES ('stale-reference')`)
		return err
	})
	require.ErrorIs(t, err, idem.ErrLockLost)
	require.Zero(t, b.countRows(t, "jobs WHERE kind = 'stale-other-worker'"), "the write on the other worker")
	require.Zero(t, b.countRows(t, "notes"), "the write in the reference table")
}
